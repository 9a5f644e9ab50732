"""What responses look like: OpenAI's completion and chat objects for one request, whole
or as SSE chunks (a chunk's JSON split around its text, so a stream writes it without
encoding the whole object per token). A request has one choice per job: ``n`` per
prompt, and a batched completion's prompts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from dynamoctl.frontend.generate import Outcome
from dynamoctl.frontend.protocol import usage

_MARK = "\x00\x01\x02"
_MARK_JSON = encode_basestring_ascii(_MARK).encode()


class Shape:
    """OpenAI response objects for one request."""

    def __init__(self, endpoint: str, request_id: str, model: str) -> None:
        self.endpoint = endpoint
        self.chat = endpoint == "chat"
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"
        self.running_usage: Callable[[int], Any] | None = None
        """Choice index -> its usage so far, for a stream whose every chunk carries one
        (``continuous_usage_stats``); None: chunks carry ``usage: null``."""

    def _choice(
        self,
        text: str | None,
        finish: str | None,
        *,
        first: bool = False,
        index: int = 0,
        logprobs: Any = None,
    ) -> Any:
        if self.chat:
            delta: dict[str, str] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: Any = None,
    ) -> Any:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, finish, first=first, index=index, logprobs=logprobs)],
        }

    def with_usage(self, obj: Any, include_usage: bool) -> Any:
        if include_usage:
            running = self.running_usage
            obj["usage"] = None if running is None else running(obj["choices"][0]["index"])
        return obj

    def text_frame(self, include_usage: bool, index: int = 0) -> tuple[bytes, bytes] | None:
        """The SSE event of a text chunk split around its text: ``head + json(text) + tail``
        is byte for byte ``sse_data(self.with_usage(self.chunk(text), include_usage))``.
        None where chunks differ by more than their text (usage in every chunk), and in
        the one case the split is ambiguous (a model named exactly ``_MARK``)."""
        if self.running_usage is not None:
            return None
        event = sse_data(self.with_usage(self.chunk(_MARK, index=index), include_usage))
        head, sep, tail = event.partition(_MARK_JSON)
        return (head, tail) if sep and _MARK_JSON not in tail else None

    def full(
        self, choices: Sequence[tuple[str, Outcome, Any]], prompt_tokens: int, cached: int
    ) -> Any:
        """The whole response: ``choices`` are (text, outcome, logprobs) in index order."""
        rendered = []
        for index, (text, outcome, logprobs) in enumerate(choices):
            if self.chat:
                rendered.append({
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": outcome.finish_reason,
                })  # fmt: skip
            else:
                rendered.append(
                    self._choice(text, outcome.finish_reason, index=index, logprobs=logprobs)
                )
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": rendered,
            "usage": usage_of([o for _, o, _ in choices], prompt_tokens, cached),
        }


def usage_of(outcomes: Sequence[Outcome], prompt_tokens: int, cached: int) -> Any:
    """OpenAI's usage of a request: the prompts once, every choice's completion."""
    completion = sum(o.completion_tokens for o in outcomes)
    return usage(prompt_tokens, completion, cached).model_dump()


def sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
