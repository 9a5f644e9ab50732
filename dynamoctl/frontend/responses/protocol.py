"""Responses API request bodies, validated as strictly as the chat endpoints
(:mod:`dynamoctl.frontend.protocol`): unknown fields are 400s naming them, parameters not
implemented are accepted only when neutral (their rows in
:mod:`dynamoctl.frontend.compat_policy`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from dynamoctl.frontend import compat
from dynamoctl.frontend.compat_policy import Endpoint
from dynamoctl.frontend.errors import ParamError
from dynamoctl.frontend.protocol import MAX_TOKENS_LIMIT
from dynamoctl.structured.request import Name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """An earlier answer's text, sent back as input."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list, max_length=0)
    """Only empty: no annotations are produced."""
    logprobs: list[Any] | None = None
    """Accepted as the earlier answer carried it; not part of the prompt."""


Part = Annotated[InputText | OutputText, Field(discriminator="type")]


class MessageItem(_Strict):
    """A message of the conversation (``type`` may be left out, as the SDK allows)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    """An earlier answer's function call."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: Name
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Strict):
    """A function call's result."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningItem(_Strict):
    """An earlier answer's reasoning: accepted and left out of the prompt."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else "invalid"
    return getattr(value, "type", "invalid")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """JSON Schema of the arguments."""
    strict: bool | None = None
    """Accepted: forced calls are always enforced exactly (``tool_choice``)."""


class NamedFunction(_Strict):
    type: Literal["function"]
    name: Name


ToolChoice = Literal["none", "auto", "required"] | NamedFunction


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: Name
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: Annotated[
        TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
    ] = Field(default_factory=lambda: TextFormatText(type="text"))
    """``text``, ``json_object``, or ``json_schema`` (enforced by the engine)."""
    verbosity: Literal["medium"] | None = None
    """Only ``medium`` (or null): the model's own verbosity."""


class ResponsesRequest(_Strict):
    ENDPOINT: ClassVar[Endpoint] = "responses"

    model: str = Field(min_length=1)
    """Served model name (``GET /v1/models``)."""
    input: str | list[InputItem]
    """Text (one user message), or input items: messages, function calls and their
    outputs, reasoning (left out of the prompt)."""
    instructions: str | None = None
    """A leading system message, for this response only (not carried to the next)."""
    max_output_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    """Continue a stored response's conversation (its input and output)."""
    store: bool = True
    """Keep the response for ``previous_response_id`` and ``GET`` (bounded store)."""
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16
    )
    """Up to 16 string pairs, returned with the response."""
    user: str | None = None
    """Informational: asks for no behaviour, recorded nowhere."""
    safety_identifier: str | None = None
    """Informational, like ``user``."""

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_unsupported(data, cls.ENDPOINT)

    @model_validator(mode="after")
    def _choice_needs_tools(self) -> ResponsesRequest:
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ParamError("tool_choice", "tool_choice needs tools")
        return self
