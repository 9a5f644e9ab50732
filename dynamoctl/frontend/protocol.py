"""OpenAI request and response bodies, as the frontend accepts and produces them.

Requests are validated strictly: an unknown field or a parameter we do not implement is a
400 that names it, never silently ignored (a client that asks for ``n=3`` or ``logprobs``
must learn it did not get them), and a value of the wrong JSON type is refused, not
coerced (``"max_tokens": "5"``, ``"stream": 1``). Response shapes follow OpenAI's exactly,
so the official client parses them unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dynamoctl.structured.request import StructuredOutputFields, ToolFields, ToolMessageFields

MAX_TOKENS_LIMIT = 1 << 20
"""No context is longer than this; larger max_tokens values are a client bug (and would
overflow engines' int32 fields)."""


INT64 = (-(2**63), 2**63 - 1)
"""What engines and the request plane carry an integer in (msgpack, torch)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a final chunk with ``usage`` before ``[DONE]``."""


class _Sampling(_Strict):
    """Parameters shared by chat and text completions."""

    model: str = Field(min_length=1)
    """Served model name (``GET /v1/models``)."""
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    """Most tokens to generate; default: the rest of the context."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=INT64[0], le=INT64[1])] | None = None
    stop: str | list[str] | None = None
    """Up to 4 strings; generation ends before the first one, which is not returned."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    """Only one choice per request is supported."""
    ignore_eos: bool = False
    """Extension (as in vLLM): generate exactly ``max_tokens``, ignoring end-of-sequence."""
    user: str | None = None
    """Accepted for compatibility; recorded nowhere."""

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        # An int field, not Literal[1]: a literal also matches true and 1.0.
        if value != 1:
            raise ValueError("only n=1 (one choice per request) is supported")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatMessage(_Strict, ToolMessageFields):  # tool fields: dynamoctl.structured
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """Text, or OpenAI content parts of type ``text`` (other part types are refused)."""
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(
        cls, value: str | list[dict[str, Any]] | None
    ) -> str | list[dict[str, Any]] | None:
        if isinstance(value, list):
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only content parts of type 'text' are supported")
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling, StructuredOutputFields, ToolFields):  # dynamoctl.structured
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    """Newer name of ``max_tokens``; wins when both are given."""

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling, StructuredOutputFields):  # dynamoctl.structured
    prompt: str | list[int] = Field(min_length=1)
    """Text, or pre-tokenised ids. Lists of prompts (batches) are not supported."""
    echo: bool = False
    """Not supported: only ``false`` is accepted."""

    @field_validator("prompt")
    @classmethod
    def _token_ids_in_range(cls, value: str | list[int]) -> str | list[int]:
        if isinstance(value, list) and any(not 0 <= t < 2**31 for t in value):
            raise ValueError("token ids must be in [0, 2**31)")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value

    def token_limit(self) -> int | None:
        return self.max_tokens


# -- responses ---------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage(prompt: int, completion: int, cached: int) -> Usage:
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


FinishReason = Literal["stop", "length"]
