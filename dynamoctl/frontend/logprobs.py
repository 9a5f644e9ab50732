"""Log-probabilities as OpenAI returns them: chat's ``{"content": [{token, logprob, bytes,
top_logprobs}]}`` and completions' parallel lists (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``), from the engine's per-token entries
(:class:`~dynamoctl.wire.engine.TokenLogprobs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynamoctl.tokenizer import Tokenizer
from dynamoctl.wire.engine import TokenLogprobs

Entries = Sequence[tuple[int, TokenLogprobs]]
"""Output tokens with their log-probabilities."""


class LogprobsRenderer:
    """One choice's log-probabilities, chunk after chunk (completions' ``text_offset``
    continues where the previous chunk ended)."""

    def __init__(self, tokenizer: Tokenizer, chat: bool, offset: int = 0) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.offset = offset
        """Characters of the choice's text before the next token (an echoed prompt's)."""

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render(self, entries: Entries) -> dict[str, Any]:
        return self._chat(entries) if self.chat else self._completion(entries)

    def _chat(self, entries: Entries) -> dict[str, Any]:
        content = []
        for token_id, lp in entries:
            text = self.token(token_id)
            top = [
                {"token": (t := self.token(i)), "logprob": p, "bytes": list(t.encode())}
                for i, p in zip(lp.top_ids, lp.top_logprobs, strict=False)
            ]
            entry = {"token": text, "logprob": lp.logprob, "bytes": list(text.encode())}
            content.append({**entry, "top_logprobs": top})
        return {"content": content, "refusal": None}

    def _completion(self, entries: Entries) -> dict[str, Any]:
        tokens, logprobs, tops, offsets = [], [], [], []
        for token_id, lp in entries:
            text = self.token(token_id)
            tokens.append(text)
            logprobs.append(lp.logprob)
            tops.append(
                {self.token(i): p for i, p in zip(lp.top_ids, lp.top_logprobs, strict=False)}
            )
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
