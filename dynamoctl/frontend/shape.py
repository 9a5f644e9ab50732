"""What responses look like: OpenAI's completion and chat objects for one request, whole
or as SSE chunks (a chunk's JSON split around its text, so a stream writes it without
encoding the whole object per token)."""

from __future__ import annotations

import json
import time
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

    def _choice(self, text: str | None, finish: str | None, *, first: bool = False) -> Any:
        if self.chat:
            delta: dict[str, str] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> Any:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, finish, first=first)],
        }

    @staticmethod
    def with_usage(obj: Any, include_usage: bool) -> Any:
        if include_usage:
            obj["usage"] = None
        return obj

    def text_frame(self, include_usage: bool) -> tuple[bytes, bytes] | None:
        """The SSE event of a text chunk split around its text: ``head + json(text) + tail``
        is byte for byte ``sse_data(self.with_usage(self.chunk(text), include_usage))``.
        None in the one case the split is ambiguous (a model named exactly ``_MARK``)."""
        event = sse_data(self.with_usage(self.chunk(_MARK), include_usage))
        head, sep, tail = event.partition(_MARK_JSON)
        return (head, tail) if sep and _MARK_JSON not in tail else None

    def full(self, text: str, outcome: Outcome, prompt_tokens: int) -> Any:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": outcome.finish_reason,
            }
        else:
            choice = self._choice(text, outcome.finish_reason)
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_of(outcome, prompt_tokens),
        }


def usage_of(outcome: Outcome, prompt_tokens: int) -> Any:
    return usage(prompt_tokens, outcome.completion_tokens, outcome.cached_tokens).model_dump()


def sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
