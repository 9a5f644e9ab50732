"""Incremental detokenisation: turn streamed token ids into text, one chunk at a time.

Decoding tokens one by one and concatenating is wrong in two ways:

- a character can span tokens: in a byte-level BPE, "中" (3 UTF-8 bytes) may be three
  tokens, and decoding the first alone gives U+FFFD;
- a token's text can depend on its neighbours: SentencePiece-style decoders drop the
  leading space of the first token they see, so "▁world" decodes to "world" alone but to
  " world" after "Hello".

So, as vLLM and TGI do, we decode a short window of ids (a few tokens of context, plus the
new ones) and emit the difference between the window's text and its context's text. Text
ending in U+FFFD may be a character whose remaining bytes are still to come: it is held back
until a later token completes it (or :meth:`IncrementalDetokenizer.flush` gives up at the
end). Text before it is emitted at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynamoctl.tokenizer.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"
"""What decoders produce for bytes that are not (yet) valid UTF-8."""

PROMPT_CONTEXT_TOKENS = 5
"""Prompt tokens decoded as context for the first generated tokens (vLLM uses 5 too)."""


class IncrementalDetokenizer:
    """Text of one generated sequence, fed a few token ids at a time.

    ``push(ids)`` returns the text those ids complete; the concatenation of every ``push``
    and the final ``flush()`` is exactly ``tokenizer.decode(generated_ids)`` (with the
    prompt's tail as context when ``prompt_ids`` is given). No chunk ends in a partial
    character, so for valid text no chunk contains U+FFFD.
    """

    __slots__ = ("_emitted", "_ids", "_prefix_len", "_read", "_skip", "_tokenizer")

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # _ids is the decode window: _ids[:_read] is context whose text is already accounted
        # for (_prefix_len chars); _emitted counts chars after it emitted since the window
        # last moved (a held-back partial character keeps the window from moving).
        self._ids = list(prompt_ids[max(0, len(prompt_ids) - PROMPT_CONTEXT_TOKENS) :])
        self._read = len(self._ids)
        self._prefix_len = len(self._decode(self._ids))
        self._emitted = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the text they complete (possibly empty)."""
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        text = self._decode(self._ids)
        # A trailing run of U+FFFD may still turn into characters (byte-fallback decoders
        # give one U+FFFD per byte of an incomplete character), so all of it waits.
        stable = len(text.rstrip(REPLACEMENT))
        start = self._prefix_len + self._emitted
        out = text[start:stable] if stable > start else ""
        if stable == len(text):
            # Everything is final: the new tokens become the context of the next push.
            del self._ids[: self._read]
            self._read = len(self._ids)
            self._prefix_len = len(self._decode(self._ids))
            self._emitted = 0
        else:
            self._emitted += len(out)
        return out

    def flush(self) -> str:
        """End of the sequence: return the text still held back, U+FFFD included (the bytes
        of a character the sequence never finished). Call once, after the last push."""
        text = self._decode(self._ids)
        start = self._prefix_len + self._emitted
        self._emitted = max(self._emitted, len(text) - self._prefix_len)
        return text[start:]
