"""OpenAI request and response bodies, as the frontend accepts and produces them.

Requests are validated strictly: an unknown field is a 400 that names it, a parameter we do
not implement is accepted only with a value that asks for nothing (the policy in
:mod:`dynamoctl.frontend.compat`, docs/api.md), never silently ignored, and a value of the
wrong JSON type is refused, not coerced (``"max_tokens": "5"``, ``"stream": 1``).
Response shapes follow OpenAI's exactly, so the official client parses them unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dynamoctl.frontend import compat
from dynamoctl.frontend.compat_policy import Endpoint
from dynamoctl.frontend.errors import ParamError
from dynamoctl.structured.request import StructuredOutputFields, ToolFields, ToolMessageFields

MAX_TOKENS_LIMIT = 1 << 20
"""No context is longer than this; larger max_tokens values are a client bug (and would
overflow engines' int32 fields)."""


INT64 = (-(2**63), 2**63 - 1)
"""What engines and the request plane carry an integer in (msgpack, torch)."""

MAX_LOGPROBS = 20
"""Most alternatives per token (vLLM's default ``max_logprobs``)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a final chunk with ``usage`` before ``[DONE]``."""
    continuous_usage_stats: bool = False
    """vLLM's: with ``include_usage``, every chunk carries its choice's usage so far (its
    prompt's tokens, the tokens generated until then)."""

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_object_keys(data, "stream_options")

    def usage_every_chunk(self) -> bool:
        return self.include_usage and self.continuous_usage_stats


def _token_ids(ids: list[int]) -> list[int]:
    if any(not 0 <= t < 2**31 for t in ids):
        raise ValueError("token ids must be in [0, 2**31)")
    return ids


TokenIds = Annotated[list[int], AfterValidator(_token_ids)]
Prob = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


class _Request(_Strict):
    """Parameters shared by chat and text completions (docs/api.md lists each, and the
    ones not implemented: :mod:`dynamoctl.frontend.compat`). Another module's request
    parameters join as a mixin of both request models."""

    ENDPOINT: ClassVar[Endpoint]

    model: str = Field(min_length=1)
    """Served model name (``GET /v1/models``)."""
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    """Most tokens to generate per choice; default: the rest of the context."""
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    """Newer name of ``max_tokens``; wins when both are given."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=INT64[0], le=INT64[1])] | None = None
    """Choice ``i`` of ``n`` uses ``seed + i``."""
    stop: str | list[str] | None = None
    """Up to 4 strings; generation ends before the first one, which is not returned."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    """Choices to generate (null: 1); at most the frontend's ``max_choices``."""
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    """Token id (as a JSON key) → bias added to its logit."""
    user: str | None = None
    """Informational: asks for no behaviour, recorded nowhere."""
    # vLLM's extensions
    top_k: Annotated[int, Field(ge=-1)] | None = None
    """-1 or 0: off."""
    min_p: Prob | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    """No end-of-sequence or stop token ends a choice before this many tokens."""
    ignore_eos: bool = False
    """Generate exactly ``max_tokens``, ignoring end-of-sequence (``stop``,
    ``stop_token_ids`` still apply)."""
    stop_token_ids: TokenIds | None = None
    """Token ids that end a choice (the token's text is not returned)."""

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_unsupported(data, cls.ENDPOINT)

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not (key.isascii() and key.isdigit() and int(key) < 2**31):
                raise ValueError(f"keys must be token ids, got {key[:40]!r}")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options", "stream_options is only allowed with stream: true")
        return self

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def choices(self) -> int:
        return self.n or 1

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def bias(self) -> dict[int, float] | None:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token to return; None: no log-probabilities."""
        raise NotImplementedError


class ChatMessage(_Strict, ToolMessageFields):  # tool fields: dynamoctl.structured
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """Text, or OpenAI content parts of type ``text`` and ``image_url`` (images:
    :mod:`dynamoctl.frontend.images`; other part types are refused)."""
    name: str | None = None
    """Passed to the chat template (which decides whether to render it)."""

    @field_validator("content")
    @classmethod
    def _known_parts(
        cls, value: str | list[dict[str, Any]] | None
    ) -> str | list[dict[str, Any]] | None:
        if isinstance(value, list):
            for part in value:
                kind = part.get("type")
                if kind == "image_url":
                    _check_image_part(part)
                elif kind != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        "only content parts of type 'text' and 'image_url' are supported"
                    )
        return value

    def text(self, image: str = "") -> str:
        """The message's text, with ``image`` where each image part is."""
        if isinstance(self.content, list):
            return "".join(
                part["text"] if part["type"] == "text" else image for part in self.content
            )
        return self.content or ""

    def image_urls(self) -> list[tuple[int, str]]:
        """Each image part's index among the parts and its URL."""
        if not isinstance(self.content, list):
            return []
        return [(i, p["image_url"]["url"]) for i, p in enumerate(self.content)
                if p["type"] == "image_url"]  # fmt: skip

    def for_template(self, image: str = "") -> dict[str, Any]:
        """The message as the chat template sees it (``image``: an image's placeholder)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text(image)}
        if self.name is not None:
            message["name"] = self.name
        return {**message, **self.tool_template_fields()}  # dynamoctl.structured


def _check_image_part(part: dict[str, Any]) -> None:
    """An ``image_url`` part's shape (its content is read later, with the model known)."""
    if set(part) != {"type", "image_url"}:
        raise ValueError("an image_url part has only 'type' and 'image_url'")
    image = part["image_url"]
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        raise ValueError("image_url must be an object with a 'url' string")
    if not set(image) <= {"url", "detail"}:
        raise ValueError("image_url has only 'url' and 'detail'")
    if image.get("detail", "auto") != "auto":
        # OpenAI's low/high change the image's token count; a model here has one count.
        raise ValueError("image_url.detail: only 'auto' is supported (the model's own size)")


class ChatCompletionRequest(_Request, StructuredOutputFields, ToolFields):  # dynamoctl.structured
    ENDPOINT: ClassVar[Endpoint] = "chat"

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    """Return each output token's log-probability."""
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """Alternatives per token, with ``logprobs: true``."""
    safety_identifier: str | None = None
    """Informational, like ``user``."""

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self, image: str = "") -> list[dict[str, Any]]:
        """The messages as the chat template sees them, ``image`` for each image part."""
        return [m.for_template(image) for m in self.messages]


class CompletionRequest(_Request, StructuredOutputFields):  # dynamoctl.structured
    ENDPOINT: ClassVar[Endpoint] = "completions"

    prompt: str | Annotated[list[int | str | list[int]], Field(min_length=1)] = Field(min_length=1)
    """Text, token ids, or a batch of either (one choice per prompt, times ``n``)."""
    echo: bool = False
    """The prompt's text precedes each choice's text."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """Return each output token's log-probability and this many alternatives."""

    @field_validator("prompt")
    @classmethod
    def _one_kind(cls, value: str | list[int | str | list[int]]) -> Any:
        if isinstance(value, str):
            return value
        if all(isinstance(p, int) for p in value):
            return _token_ids(value)  # type: ignore[arg-type]
        if all(isinstance(p, str) for p in value):
            if not all(value):
                raise ValueError("a batch's prompts must not be empty")
            return value
        if all(isinstance(p, list) for p in value):
            for p in value:
                if not p:
                    raise ValueError("a batch's prompts must not be empty")
                _token_ids(p)  # type: ignore[arg-type]
            return value
        raise ValueError("must be text, token ids, or a list of either (not a mix)")

    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    """Each choice's ``prompt_logprobs``: every prompt token's log-probability and this
    many alternatives (vLLM's)."""

    @model_validator(mode="after")
    def _prompt_scores_not_streamed(self) -> CompletionRequest:
        # vLLM's rule for prompt_logprobs; echo with logprobs is likewise whole-only here.
        if self.stream and self.prompt_logprobs is not None:
            raise ParamError("prompt_logprobs", "prompt_logprobs is not available with stream")
        if self.stream and self.echo and self.logprobs is not None:
            raise ParamError("echo", "echo with logprobs is not available with stream")
        return self

    def prompt_logprobs_count(self) -> int | None:
        """Alternatives per prompt token to ask the engine for (``echo`` with ``logprobs``
        needs the prompt's, as vLLM does); None: none."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None

    def prompts(self) -> list[str] | list[list[int]]:
        """The batch: one prompt per entry."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [cast(list[int], self.prompt)]
        return cast(list[str] | list[list[int]], self.prompt)

    def top_logprobs_count(self) -> int | None:
        return self.logprobs


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
