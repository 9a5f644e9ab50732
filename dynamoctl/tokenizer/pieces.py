"""Cutting a long text into pieces that tokenise to the same ids one by one, so that the
first turn of an agent's conversation (a 32k-100k-token history) is tokenised on several
cores at once (docs/tokenizer.md, "Long texts on several cores").

A cut goes at a single space between two letters (``...word| word...``). The regex
pre-tokenizers of byte-level BPE models (GPT-2's, Llama 3's) always start a pre-token
there, and BPE never merges across pre-tokens, so for them ``ids(a + b) == ids(a) +
ids(b)``. Not every tokenizer does (a normaliser that prepends ``▁`` to its input, an added
token containing a space), so a tokenizer is cut only if it passes a check on probe texts
at first use, and each cut only if the text around it, tokenised whole and in two, gives
the same ids; otherwise the text is tokenised whole.
"""

from __future__ import annotations

import itertools
import re
import weakref

from tokenizers import Tokenizer as FastTokenizer

MIN_PIECE_CHARS = 32 << 10
"""A piece is at least this long (~8k tokens): shorter ones are not worth a thread."""
WINDOW_CHARS = 256
"""Characters on each side of a cut that must tokenise the same whole and in two."""
_SEARCH_CHARS = 4096
"""How far past each even division a cut is looked for."""
_CUT = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")
"""A single space between two letters."""
_PROBES = (
    ("hello", " world"),
    ("The agent", " reads the file"),
    ("naïve", " café"),
    ("x\n\nfoo", " bar: 123"),
    ("日本語", " テキスト"),
)

_checked: weakref.WeakKeyDictionary[FastTokenizer, bool] = weakref.WeakKeyDictionary()


def cuttable(tokenizer: FastTokenizer) -> bool:
    """Whether ``tokenizer`` splits the probe texts at their cut (checked once). One that
    truncates or pads never is: each piece would be truncated or padded on its own."""
    known = _checked.get(tokenizer)
    if known is None:
        plain = tokenizer.truncation is None and tokenizer.padding is None
        known = _checked[tokenizer] = plain and all(
            _agrees(tokenizer, left, right) for left, right in _PROBES
        )
    return known


def pieces(tokenizer: FastTokenizer, text: str, most: int) -> list[str]:
    """``text`` in at most ``most`` pieces of at least :data:`MIN_PIECE_CHARS`, each cut
    checked (``[text]`` when none can be made). Their ids, encoded without the
    post-processor and concatenated, are ``text``'s."""
    count = min(most, len(text) // MIN_PIECE_CHARS)
    if count < 2 or not cuttable(tokenizer):
        return [text]
    step = len(text) // count
    cuts: list[int] = []
    for k in range(1, count):
        found = _CUT.search(text, k * step, k * step + _SEARCH_CHARS)
        if found is None:
            continue
        at = found.start()
        lo, hi = max(0, at - WINDOW_CHARS), at + WINDOW_CHARS
        if _agrees(tokenizer, text[lo:at], text[at:hi]):
            cuts.append(at)
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _agrees(tokenizer: FastTokenizer, left: str, right: str) -> bool:
    whole, a, b = tokenizer.encode_batch_fast([left + right, left, right], add_special_tokens=False)
    return bool(whole.ids == a.ids + b.ids)
