"""A text's ids from the ids of its words, so that words seen before cost a dictionary
lookup instead of a pass through the tokenizer (docs/tokenizer.md, "Word cache").

Most of what the ``tokenizers`` wheel spends on a long text is not BPE (which keeps its
own word cache) but the pipeline around it: each pre-token becomes a Rust object with
its alignments (splitting on a plain space costs as much as the regex). The regexes that
byte-level BPE tokenizers split text with (GPT-2's, Llama 3's, Qwen2's) start a pre-token
at every space that follows a character other than whitespace (no alternative matches
such a pair), and BPE never merges across pre-tokens; so a text cut before each such
space gives, chunk by chunk, the whole text's ids. Chunks are cut with ``str.split(" ")``
(a chunk after a space that follows whitespace joins the chunk before it) and their ids
(with the leading space) are kept in a bounded dictionary.

Only tokenizers declared as those models' are cached: a byte-level BPE without dropout,
one of the :data:`PATTERNS`, no normaliser or NFC (which never composes across a space),
no padding or truncation, no added token holding whitespace or stripping it (an added
token is matched before the regex runs); and they must also pass
:func:`dynamoctl.tokenizer.pieces.cuttable`'s probes.
"""

from __future__ import annotations

import itertools
import json

from tokenizers import Tokenizer as FastTokenizer
from tokenizers.models import BPE

from dynamoctl.tokenizer.pieces import cuttable, pieces

PATTERNS = frozenset({
    # GPT-2's (what ``ByteLevel(use_regex=True)`` runs)
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    # Llama 3's
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Qwen2's
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
})  # fmt: skip
"""Pre-tokenizer regexes whose every match holds a space only at its start or among
whitespace: the cut before a space that follows other text is always a pre-token's start."""
MAX_WORDS = 1 << 16
"""Chunks kept at most (each ~100-200 bytes with its ids); a full cache starts over."""
MAX_CHARS = 1 << 22
"""Characters of kept chunks at most (a text of long chunks fills it first)."""
LEARN_FROM_WORDS = 1024
"""A text of fewer words goes through the cache only if 3/4 of its first words are known
(else it is tokenised whole and teaches nothing): splitting, looking up and learning a
short text's words costs more than the tokenizer when most are new
(benchmarks/results/word_cache.json); longer texts repeat enough of their own words."""
_SAMPLE = 32
MIN_CHARS = 256
"""Shorter texts are tokenised whole (the split is not worth it)."""


def _declared(tokenizer: FastTokenizer) -> bool:
    """Whether ``tokenizer`` is declared as one of the byte-level BPEs above."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return False
    model = tokenizer.model
    if not isinstance(model, BPE) or model.dropout is not None:
        return False
    normalizer = tokenizer.normalizer
    if normalizer is not None and json.loads(normalizer.__getstate__()) != {"type": "NFC"}:
        return False
    if tokenizer.pre_tokenizer is None:
        return False
    spec = json.loads(tokenizer.pre_tokenizer.__getstate__())
    if spec["type"] == "ByteLevel":
        regex_ok = bool(spec.get("use_regex", True))  # GPT-2's regex, built in
    elif spec["type"] == "Sequence" and len(spec["pretokenizers"]) == 2:
        split, level = spec["pretokenizers"]
        regex_ok = (
            split["type"] == "Split"
            and split["pattern"].get("Regex") in PATTERNS
            and split["behavior"] == "Isolated"
            and not split["invert"]
            and level["type"] == "ByteLevel"
            and not level.get("use_regex", True)
        )
    else:
        return False
    return regex_ok and not any(
        t.lstrip or t.rstrip or t.single_word or any(c.isspace() for c in t.content)
        for t in tokenizer.get_added_tokens_decoder().values()
    )


def _chunks(words: list[str], bad: set[str]) -> list[str]:
    """``text.split(" ")`` regrouped so that no chunk follows a ``bad`` word (empty, or
    ending in whitespace: the space after it may be inside a pre-token): a bad word and
    those after it up to the first good one are one chunk."""
    chunks: list[str] = []
    done, last = 0, len(words) - 1
    for at in [i for i, w in enumerate(words) if w in bad]:
        if at < done:
            continue  # already in the chunk before
        chunks += words[done:at]
        end = at
        while end < last and words[end] in bad:
            end += 1
        chunks.append(" ".join(words[at : end + 1]))
        done = end + 1
    chunks += words[done:]
    return chunks


def _one_word(chunk: str) -> bool:
    """Whether ``chunk`` (after its space) holds no other space and ends a cut's left."""
    return bool(chunk) and " " not in chunk and not chunk[-1].isspace()


class WordCache:
    """Ids of texts without the post-processor (``add_special_tokens=False``), from the
    cached ids of their chunks. Safe to share between threads: the dictionary only grows
    and, when full, is replaced, never emptied.

    The chunks not yet known are tokenised together, in one call, so that new text costs
    what the tokenizer alone would. Those of one word are joined by their spaces: in
    byte-level BPE a space is ``Ġ`` and begins the first token of its chunk, and no other
    token of a chunk without another space, so the ids are cut before each token that
    begins with ``Ġ``. The others (a word after whitespace, with the words it joins) are
    joined by an added token the text does not hold: the tokenizer splits at added tokens
    before anything else, so their ids lie between two of its id."""

    def __init__(self, tokenizer: FastTokenizer) -> None:
        self._tokenizer = tokenizer
        self._known: dict[str, list[int]] = {}
        """chunk after a space -> ids of the space and the chunk"""
        self._chars = 0
        """Characters of the chunks in ``_known``."""
        added = sorted(tokenizer.get_added_tokens_decoder().items(), reverse=True)
        self._separators = [(t.content, i) for i, t in added]
        """Added tokens to join chunks with, last first (reserved tokens are last)."""
        self._spaced: bytes | None = None
        """Per id: 1 for a token that begins with a space (made at first use: ~50 ms for
        a 128k vocabulary, which a process that never encodes a long text need not pay)."""

    @classmethod
    def of(cls, tokenizer: FastTokenizer) -> WordCache | None:
        """A cache for ``tokenizer``, or None when it is not one the cut is proven for."""
        return cls(tokenizer) if _declared(tokenizer) and cuttable(tokenizer) else None

    def encode(self, text: str, most: int = 1) -> list[int]:
        """``text``'s ids, as ``encode(text, add_special_tokens=False)`` gives them; what
        is tokenised is cut into at most ``most`` pieces (:mod:`pieces`) tokenised at once."""
        if len(text) < MIN_CHARS:
            return self._encode(text, most)
        words = text.split(" ")
        if len(words) < LEARN_FROM_WORDS:  # a short text pays only if most words are known
            sample = words[1 : 1 + _SAMPLE]
            if 4 * sum(map(self._known.__contains__, sample)) < 3 * len(sample):
                return self._encode(text, most)
        unique = set(words[:-1])  # no cut follows the last word
        bad = {w for w in unique if not w or w[-1].isspace()}
        if bad:
            words = _chunks(words, bad)
            unique = set(words)
        else:
            unique.add(words[-1])
        first, rest = words[0], words[1:]
        known = self._known  # ``unique`` holds the first chunk too: learnt as a later one
        missing = list(unique.difference(known))
        tokenised = self._tokenise(first, missing, most)
        if tokenised is None:
            return self._encode(text, most)  # no added token to join chunks with
        ids, fresh = tokenised
        chars = sum(map(len, fresh))
        if len(known) + len(fresh) > MAX_WORDS or self._chars + chars > MAX_CHARS:
            known = {w: known[w] for w in unique.difference(fresh)}
            self._known, self._chars = known, sum(map(len, known))
        known.update(fresh)
        self._chars += chars  # not exact when threads add at once: a bound, not a count
        extend = ids.extend
        for chunk_ids in map(known.__getitem__, rest):
            extend(chunk_ids)
        return ids

    def _tokenise(
        self, first: str, missing: list[str], most: int
    ) -> tuple[list[int], dict[str, list[int]]] | None:
        """The ids of ``first`` and of each chunk in ``missing`` (after its space), from one
        call on them joined (None when they cannot be joined)."""
        words = [w for w in missing if _one_word(w)]
        others = [" " + w for w in set(missing).difference(words)]
        lead = _one_word(first)  # the words follow it; else it is joined apart
        head = (first if lead else "") + "".join(" " + w for w in words)
        parts = self._joined([head, *([] if lead else [first]), *others], most)
        if parts is None:
            return None
        cut = self._at_spaces(parts[0], len(words))
        if cut is None:  # the ids did not cut as they must: each chunk joined apart
            apart = self._joined([first, *(" " + w for w in missing)], most)
            return None if apart is None else (apart[0], dict(zip(missing, apart[1:], strict=True)))
        fresh = dict(zip(words, cut[1:], strict=True))
        fresh.update(zip((o[1:] for o in others), parts[len(parts) - len(others) :], strict=True))
        return (cut[0] if lead else parts[1]), fresh

    def _at_spaces(self, ids: list[int], words: int) -> list[list[int]] | None:
        """``ids`` cut before each token that begins with a space: what comes before the
        first and each of ``words`` spaced words (None unless there are that many)."""
        spaced = self._spaced
        if spaced is None:  # two threads at once would make the same table: harmless
            table = bytearray(self._tokenizer.get_vocab_size(with_added_tokens=True))
            for token, i in self._tokenizer.get_vocab(with_added_tokens=False).items():
                table[i] = token.startswith("Ġ")
            spaced = self._spaced = bytes(table)
        marks = bytes(map(spaced.__getitem__, ids))
        if marks.count(1) != words:
            return None
        cuts, at = [], -1
        for _ in range(words):
            at = marks.find(1, at + 1)
            cuts.append(at)
        return [ids[a:b] for a, b in itertools.pairwise([0, *cuts, len(ids)])]

    def _joined(self, texts: list[str], most: int) -> list[list[int]] | None:
        """Each text's ids, from one call on the texts joined by an added token none of
        them holds (None when each added token is in one)."""
        if len(texts) == 1:
            return [self._encode(texts[0], most)]
        separator = next(
            ((c, i) for c, i in self._separators if all(c not in t for t in texts)), None
        )
        if separator is None:
            return None
        content, sep = separator
        ids = self._encode(content.join(texts), most)
        if ids.count(sep) != len(texts) - 1:
            return None  # an added token matched across a join (none of the usual do)
        parts, start, index = [], 0, ids.index
        for _ in range(len(texts) - 1):
            end = index(sep, start)
            parts.append(ids[start:end])
            start = end + 1
        parts.append(ids[start:])
        return parts

    def _encode(self, text: str, most: int) -> list[int]:
        texts = pieces(self._tokenizer, text, most) if most > 1 else [text]
        encoded = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ids: list[int] = encoded[0].ids
        for part in encoded[1:]:
            ids += part.ids
        return ids
