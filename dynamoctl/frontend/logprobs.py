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
PromptEntries = Sequence[tuple[int, TokenLogprobs | None]]
"""Prompt tokens with theirs (None: the first token, which nothing precedes)."""


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

    def echoed(self, prompt: PromptEntries, output: Entries) -> dict[str, Any]:
        """``echo`` with ``logprobs``: the prompt's tokens, then the output's, as vLLM
        lists them (a prompt token's ``top_logprobs`` include the token itself)."""
        head = self._completion(prompt, with_token=True)
        tail = self._completion(output)
        return {key: head[key] + tail[key] for key in head}

    def prompt_logprobs(self, prompt: PromptEntries) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: per prompt token, ``{token id: {logprob, rank,
        decoded_token}}`` for the token and its ranked alternatives."""
        out: list[dict[str, Any] | None] = []
        for token_id, lp in prompt:
            if lp is None:
                out.append(None)
                continue
            entry = {str(token_id): _scored(lp.logprob, lp.rank, self.token(token_id))}
            for rank, (i, p) in enumerate(zip(lp.top_ids, lp.top_logprobs, strict=False), 1):
                entry.setdefault(str(i), _scored(p, rank, self.token(i)))
            out.append(entry)
        return out

    def _completion(self, entries: PromptEntries, with_token: bool = False) -> dict[str, Any]:
        tokens: list[str] = []
        logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token_id, lp in entries:
            text = self.token(token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if lp is None:
                logprobs.append(None)
                tops.append(None)
                continue
            logprobs.append(lp.logprob)
            top = {text: lp.logprob} if with_token else {}
            for i, p in zip(lp.top_ids, lp.top_logprobs, strict=False):
                top.setdefault(self.token(i), p)
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def _scored(logprob: float, rank: int | None, token: str) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": token}
