"""Anthropic Messages request bodies, as the frontend accepts them.

Validated as strictly as the OpenAI endpoints (:mod:`dynamoctl.frontend.protocol`): an
unknown field is a 400 naming it, a parameter not implemented is accepted only with a
value that asks for nothing (its row in :mod:`dynamoctl.frontend.compat_policy`). Content blocks
are declared one model per ``type``; ``cache_control`` is accepted on every block that
Anthropic allows it on and asks for nothing here, since prefix caching is automatic (the
KV router and the engines' prefix caches)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynamoctl.frontend import compat
from dynamoctl.frontend.compat_policy import Endpoint
from dynamoctl.frontend.errors import ParamError
from dynamoctl.frontend.protocol import MAX_TOKENS_LIMIT
from dynamoctl.structured.request import Name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None
    """Accepted: cached prefixes live as long as the engines' caches keep them."""


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None
    """Only null: no citations are produced."""


class ToolUseBlock(_Strict):
    """An earlier answer's tool call (assistant messages)."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: Name
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None
    """Who made the call, as the answer said: here always the model itself."""
    toolset_name: None = None
    """Only null: no toolsets (MCP) are served."""


class DirectCaller(_Strict):
    type: Literal["direct"]


class ToolResultBlock(_Strict):
    """A tool call's result (user messages)."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False
    """Rendered into the result's text ("error: ...") for the chat template."""
    cache_control: CacheControl | None = None

    def text(self) -> str:
        body = (
            self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        )
        return f"error: {body}" if self.is_error else body


class ThinkingBlock(_Strict):
    """An earlier answer's thinking: accepted and left out of the prompt (as Anthropic's
    API drops earlier turns' thinking from the context)."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]
    """Text, or content blocks: ``text``, ``tool_use`` (assistant), ``tool_result``
    (user), ``thinking``; images and documents are refused."""

    def blocks(self) -> list[Any]:
        return (
            [TextBlock(type="text", text=self.content)]
            if isinstance(self.content, str)
            else (list(self.content))
        )


class Tool(_Strict):
    """A client tool (a function). Anthropic's server tools (web search, code execution,
    ...) are refused by their ``type``."""

    name: Name
    description: str | None = None
    input_schema: dict[str, Any]
    """JSON Schema of the tool's input (an object)."""
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: Name | None = None
    """With ``type: tool``: the tool to call."""
    disable_parallel_tool_use: bool = False
    """At most one tool call per answer."""

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ParamError("tool_choice.name", "tool_choice.name goes with type 'tool' only")
        return self


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1024)]
    """At least 1024 and less than ``max_tokens``: the thinking and the answer together
    stay within ``max_tokens`` (the budget is a target, as in Anthropic's API)."""


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled, Field(discriminator="type")]


class Metadata(_Strict):
    user_id: str | None = None
    """Informational: asks for no behaviour, recorded nowhere."""


class _Conversation(_Strict):
    """What a prompt is made of: shared by ``messages`` and ``count_tokens``."""

    ENDPOINT: ClassVar[Endpoint]

    model: str = Field(min_length=1)
    """Served model name (``GET /v1/models``)."""
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_unsupported(data, cls.ENDPOINT)

    def system_text(self) -> str:
        if isinstance(self.system, list):
            return "".join(b.text for b in self.system)
        return self.system or ""

    def thinks(self) -> bool:
        return isinstance(self.thinking, ThinkingEnabled)


class MessagesRequest(_Conversation):
    ENDPOINT: ClassVar[Endpoint] = "messages"

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
    """Most tokens to generate (required, as in Anthropic's API)."""
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, max_length=4
    )
    """Up to 4 strings; the one that ended the answer is its ``stop_sequence``."""
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None
    """Accepted: prefix caching is automatic (the KV router and the engines' caches)."""

    @model_validator(mode="after")
    def _budget_below_max(self) -> MessagesRequest:
        thinking = self.thinking
        if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= self.max_tokens:
            raise ParamError("thinking.budget_tokens", "budget_tokens must be less than max_tokens")
        return self


class CountTokensRequest(_Conversation):
    ENDPOINT: ClassVar[Endpoint] = "count_tokens"
