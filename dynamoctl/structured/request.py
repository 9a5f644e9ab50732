"""The OpenAI request fields of structured outputs and tool calling (and vLLM's
``structured_outputs`` / ``guided_*`` extensions), as mixins the request models inherit
(:mod:`dynamoctl.frontend.protocol`). Validated as strictly as the rest of a request:
an unknown key inside them is a 400 naming it."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynamoctl.structured.errors import StructuredError
from dynamoctl.wire.structured import OutputConstraint


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
"""A function's or schema's name, as OpenAI allows it."""


class JsonSchemaSpec(_Strict):
    name: Name
    """Name of the format (OpenAI requires one)."""
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    """The JSON Schema; absent: any JSON object."""
    strict: bool | None = None
    """Accepted: the schema is always enforced exactly where the engine can, else refused."""


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StructuredOutputsParams(_Strict):
    """vLLM's ``structured_outputs`` extension: exactly one constraint."""

    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None


class StructuredOutputFields(_Strict):
    """Output constraints, on chat and text completions alike."""

    response_format: ResponseFormat | None = None
    """``text`` (the default), ``json_object`` or ``json_schema``."""
    structured_outputs: StructuredOutputsParams | None = None
    """Extension (vLLM): ``json``, ``regex``, ``choice``, ``grammar`` or ``json_object``."""
    guided_json: dict[str, Any] | str | None = None
    """Extension (vLLM before 0.11): as ``structured_outputs.json``."""
    guided_regex: str | None = None
    """Extension (vLLM before 0.11): as ``structured_outputs.regex``."""
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    """Extension (vLLM before 0.11): as ``structured_outputs.choice``."""
    guided_grammar: str | None = None
    """Extension (vLLM before 0.11): as ``structured_outputs.grammar``."""

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputFields:
        self.output_constraint()
        return self

    def output_constraint(self) -> tuple[str, OutputConstraint] | None:
        """The one constraint asked for, with the parameter that asked; None: free text.
        Two at once is a ``StructuredError`` naming both (a 400)."""
        found = [c for c in self._constraints() if c is not None]
        if len(found) > 1:
            first, second = found[0][0], found[1][0]
            raise StructuredError(
                second, f"{first} and {second} both constrain the output; give one"
            )
        return found[0] if found else None

    def _constraints(self) -> list[tuple[str, OutputConstraint] | None]:
        fmt, so = self.response_format, self.structured_outputs
        found: list[tuple[str, OutputConstraint] | None] = []
        if isinstance(fmt, JsonObjectFormat):
            found.append(("response_format", OutputConstraint(json_object=True)))
        elif isinstance(fmt, JsonSchemaFormat):
            schema = fmt.json_schema.json_schema
            found.append(
                (
                    "response_format.json_schema.schema",
                    _schema_constraint("response_format.json_schema.schema", schema),
                )
                if schema is not None
                else ("response_format", OutputConstraint(json_object=True))
            )
        if so is not None:
            given = [
                (f"structured_outputs.{k}", v)
                for k, v in (
                    ("json", so.json_schema),
                    ("regex", so.regex),
                    ("choice", so.choice),
                    ("grammar", so.grammar),
                    ("json_object", so.json_object or None),
                )
                if v is not None
            ]
            if not given:
                raise StructuredError(
                    "structured_outputs",
                    "structured_outputs needs one of json, regex, choice, grammar",
                )
            found += [(name, _constraint(name, value)) for name, value in given]
        for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
            value = getattr(self, name)
            if value is not None:
                found.append((name, _constraint(name, value)))
        return found


def _schema_constraint(name: str, schema: dict[str, Any] | str) -> OutputConstraint:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise StructuredError(name, f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise StructuredError(name, "a JSON schema must be an object")
    return OutputConstraint(json_schema=schema)


def _constraint(name: str, value: Any) -> OutputConstraint:
    kind = name.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind == "json":
        return _schema_constraint(name, value)
    if kind == "json_object":
        return OutputConstraint(json_object=True)
    return OutputConstraint(**{kind: value})


# -- tools -----------------------------------------------------------------------------------


class FunctionSpec(_Strict):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """JSON Schema of the arguments; absent: no arguments."""
    strict: bool | None = None
    """Accepted: forced calls are always enforced exactly (``tool_choice``)."""


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(_Strict):
    name: Name


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolFields(_Strict):
    """Tool calling, on chat completions."""

    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    """Functions the model may call; rendered into the prompt by the chat template."""
    tool_choice: ToolChoice | None = None
    """``none``, ``auto`` (default with tools), ``required`` or ``{"type": "function",
    "function": {"name": ...}}``."""
    parallel_tool_calls: bool | None = None
    """``false``: at most one call per answer."""

    @model_validator(mode="after")
    def _choice_needs_tools(self) -> ToolFields:
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise StructuredError("tool_choice", "tool_choice needs tools")
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if choice.function.name not in names:
                raise StructuredError(
                    "tool_choice.function.name",
                    f"tool_choice names function '{choice.function.name}', which is not in "
                    f"tools ({', '.join(names)})",
                )
        return self

    def effective_tool_choice(self) -> ToolChoice:
        """What ``tool_choice`` means here: OpenAI's default is ``auto`` with tools."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"


class CalledFunction(_Strict):
    name: str
    arguments: str
    """JSON text of the arguments, as the model's earlier answer gave them."""


class ToolCallSpec(_Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ToolMessageFields(_Strict):
    """A conversation's earlier tool calls and their results (chat messages)."""

    tool_calls: list[ToolCallSpec] | None = None
    """An assistant message's calls."""
    tool_call_id: str | None = None
    """A ``tool`` message: the call it answers."""

    def tool_template_fields(self) -> dict[str, Any]:
        """These fields as chat templates read them: arguments decoded to objects (as
        transformers and vLLM pass them), absent fields left out."""
        fields: dict[str, Any] = {}
        if self.tool_calls is not None:
            fields["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _decoded(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            fields["tool_call_id"] = self.tool_call_id
        return fields


def _decoded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
