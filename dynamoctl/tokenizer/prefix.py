"""Token ids of rendered chat prompts' prefixes, so a conversation's next turn tokenises
only its new text (docs/tokenizer.md, "Prefix cache").

An agent resends its whole history every turn: turn ``k + 1``'s rendered prompt starts
with turn ``k``'s up to the generation prompt's last special token. A tokenizer splits
its input at special tokens before anything else (normalisation, pre-tokenisation, BPE
see each piece on its own), so for a cut just after a special token that neither strips
whitespace nor is normalised, ``ids(prefix + rest) == ids(prefix) + ids(rest)`` without
the post-processor's tokens (the chat path encodes with ``add_special_tokens=False``:
the template writes BOS). Only such cuts are cached, and only when the prefix's special
tokens in the ids match those in the text one for one.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from dynamoctl.tokenizer.tokenizer import Tokenizer

MIN_PREFIX_CHARS = 4096
"""Shorter prefixes are not worth an entry (tokenising them inline takes ~1 ms)."""

_PROBES = ("a", " a", "\n", "\n\nhello there", "assistant\n", " ", "é")
"""Texts that follow a cut in the check that a tokenizer really splits there: some do
not (a SentencePiece-style pre-tokenizer that marks only the input's first word)."""


def _splits(tokenizer: Tokenizer, special: str) -> bool:
    """Whether ids(special + text) == ids(special) + ids(text) for the probe texts."""
    head = tokenizer.encode(special, add_special_tokens=False)
    return all(
        tokenizer.encode(special + p, add_special_tokens=False)
        == head + tokenizer.encode(p, add_special_tokens=False)
        for p in _PROBES
    )


class _Entry(NamedTuple):
    prefix: str
    """A rendered prompt up to just after a special token."""
    ids: array[int]
    """Its ids."""
    specials: int
    """How many of them are cut tokens."""


class PrefixCache:
    """Least recently used prefixes of one tokenizer's prompts with their ids, at most
    ``max_tokens`` ids in all and a quarter of that in one entry, so that one huge prompt
    does not push every conversation out. An id is 4 bytes in an entry and its prefix's
    text ~4-5 more (2^22 ids: ~36 MB, a hundred 34k-token prefixes: 16 agents' 32k-token
    conversations at 8 turns each; 2^19 held 15 prefixes, and 16 such conversations
    turned in round robin missed every time)."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int = 1 << 22) -> None:
        self.max_tokens = max_tokens
        # Keyed by a serial number, not by the prefix: hashing a 150 KB prefix (a str's
        # hash is computed once per object, and each slice is a new object) cost ~0.1 ms
        # every lookup, where comparing a few lengths costs nothing.
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._serial = 0
        self._tokens = 0
        cuts = {
            i: t.content
            for i, t in tokenizer.backend.get_added_tokens_decoder().items()
            if t.special
            and not (t.lstrip or t.rstrip or t.normalized)
            and _splits(tokenizer, t.content)
        }
        self._cut_ids = frozenset(cuts)
        self._cut_texts = sorted(set(cuts.values()))
        self.hits = 0
        """Prompts that reused a cached prefix."""

    def split(self, text: str) -> tuple[array[int], str]:
        """The ids of the longest cached prefix of ``text`` (a fresh array: a copy of the
        entry's) and the text after it (no ids and ``text`` when none is cached)."""
        best: tuple[int, _Entry] | None = None
        longest = 0
        for key, entry in self._entries.items():
            if len(entry.prefix) > longest and text.startswith(entry.prefix):
                best, longest = (key, entry), len(entry.prefix)
        if best is None:
            return array("I"), text
        self._entries.move_to_end(best[0])
        self.hits += 1
        return best[1].ids[:], text[longest:]

    def remember(self, text: str, ids: Sequence[int], reused: int = 0) -> None:
        """Cache ``text``'s prefix up to its last special token, with its ids (``ids`` are
        ``text``'s, encoded without the post-processor). ``reused``: the characters of
        ``text`` whose ids :meth:`split` gave (those ids start ``ids``; their cut tokens
        were counted when cached, so only the rest is counted again)."""
        # A reused prefix ends just after a special token: the last one is not before it,
        # so only the new text is searched (a whole 150 KB history twice per cut text else).
        lo = max(0, reused - max(map(len, self._cut_texts), default=0))
        found = ((text.rfind(t, lo), len(t)) for t in self._cut_texts)
        cut = max((at + size for at, size in found if at >= 0), default=-1)
        too_big = len(ids) > self.max_tokens // 4
        if cut < MIN_PREFIX_CHARS or too_big:
            return
        base = None  # the entry split gave: it ends just after a special token
        for entry in self._entries.values():
            size = len(entry.prefix)
            if (size == cut or size == reused <= cut) and text.startswith(entry.prefix):
                if size == cut:
                    return  # cached already
                base = entry
        cut_ids = self._cut_ids
        last = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] in cut_ids), -1)
        done, specials = (len(base.ids), base.specials) if base is not None else (0, 0)
        start = reused if base is not None else 0
        texts = specials + sum(text.count(t, start, cut) for t in self._cut_texts)
        new_ids = ids[done : last + 1]  # ids start with the base's (split gave them)
        specials += sum(map(cut_ids.__contains__, new_ids))
        if last < 0 or specials != texts:
            return  # the text's special tokens and the ids' do not line up: do not guess
        packed = base.ids[:] if base is not None else array("I")  # a copy: one memcpy
        packed.extend(new_ids)
        self._serial += 1
        self._entries[self._serial] = _Entry(text[:cut], packed, specials)
        self._tokens += len(packed)
        while self._tokens > self.max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self._tokens -= len(dropped.ids)
