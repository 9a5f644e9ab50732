"""What a request's structured-output and tool fields ask of the engine and of the
answer: the :class:`OutputSpec` sent to the worker, the tools the chat template renders,
and the :class:`ChatShaper` that reads the answer back (docs/api.md).

Refusals are 400s that name the parameter: a schema that is not a JSON Schema, a
constraint the model's engine cannot enforce (saying which engine and why), tool calling
on a model whose recipe names no tool-call parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema
import msgspec

from dynamoctl.parsers import REASONING_PARSERS, TOOL_PARSERS
from dynamoctl.parsers.shaper import ChatShaper, ForcedCall
from dynamoctl.structured.engines import cached, refusal, simulates
from dynamoctl.structured.errors import StructuredError
from dynamoctl.structured.request import NamedToolChoice, StructuredOutputFields, ToolFields
from dynamoctl.wire.structured import OutputConstraint, OutputSpec, OutputTraits, ToolOffer

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class OutputPlan:
    """One request's structured-output and tool-calling decisions."""

    spec: OutputSpec | None = None
    """For the engine (:attr:`GenerateRequest.output`); None: free text."""
    template_tools: list[dict[str, Any]] | None = None
    """For the chat template's ``tools``."""
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    """With ``tool_choice: auto``."""
    forced: ForcedCall | None = None
    """With ``tool_choice: required`` or a named function."""
    parallel_tool_calls: bool = True
    tool_names: tuple[str, ...] = ()
    """The offered functions: a parsed call of any other is content."""

    def new_shaper(self) -> ChatShaper | None:
        """A reader of one chat answer's reasoning and tool calls (one per choice); None:
        the answer's text is its content."""
        if self.reasoning_parser is None and self.tool_parser is None and self.forced is None:
            return None
        reasoning = self.reasoning_parser
        return ChatShaper(
            REASONING_PARSERS[reasoning]() if reasoning is not None else None,
            TOOL_PARSERS[self.tool_parser]() if self.tool_parser is not None else None,
            self.forced,
            self.parallel_tool_calls,
            self.tool_names,
        )


def plan_completion(body: StructuredOutputFields, traits: OutputTraits | None) -> OutputPlan:
    asked = body.output_constraint()
    if asked is None:
        return OutputPlan()
    engine = (traits or OutputTraits()).engine
    constraint = _checked(*asked, engine)
    return OutputPlan(OutputSpec(constraint=constraint))


def plan_chat(
    body: ToolFields, asked: tuple[str, OutputConstraint] | None, traits: OutputTraits | None,
    last_role: str,
) -> OutputPlan:  # fmt: skip
    """The plan of a chat request; ``asked`` is its output constraint (and the parameter
    that asked), ``last_role`` its last message's role."""
    traits = traits or OutputTraits()
    choice = body.effective_tool_choice()
    tools = body.tools or []
    for i, tool in enumerate(tools):
        if tool.function.parameters is not None:
            _check_schema(tool.function.parameters, f"tools.{i}.function.parameters")
    forced: ForcedCall | None = None
    if choice == "required" or isinstance(choice, NamedToolChoice):
        if asked is not None:
            raise StructuredError(
                asked[0],
                f"{asked[0]} cannot be combined with tool_choice '{_choice_name(choice)}': "
                "both constrain the output",
            )
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        forced = ForcedCall(name)
        asked = ("tool_choice", OutputConstraint(json_schema=_forced_schema(body, name)))
    constraint = _checked(*asked, traits.engine) if asked is not None else None
    if choice == "auto" and traits.tool_call_parser is None:
        raise StructuredError(
            "tool_choice",
            "tool_choice 'auto' needs the model's tool-call parser, and this model has "
            "none: set model.tool_call_parser in the recipe (docs/api.md), or use "
            "tool_choice 'required' or a named function",
        )
    spec = _spec(traits, constraint, tools if choice == "auto" and last_role != "tool" else [])
    template_tools = [t.model_dump(exclude_none=True) for t in tools] if choice != "none" else None
    return OutputPlan(
        spec,
        template_tools,
        # Guided decoding applies from the first token: a constrained answer has no thinking.
        reasoning_parser=traits.reasoning_parser if constraint is None else None,
        tool_parser=traits.tool_call_parser if choice == "auto" else None,
        forced=forced,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        tool_names=tuple(t.function.name for t in tools),
    )


def _spec(
    traits: OutputTraits, constraint: OutputConstraint | None, offered: list[Any]
) -> OutputSpec | None:
    """The engine's part; the tools and thinking only for an engine that simulates (a
    model after a tool's result answers in words: the mocker is offered no tools then)."""
    engine = traits.engine
    if not simulates(engine):
        return OutputSpec(constraint=constraint) if constraint is not None else None
    offers = [ToolOffer(t.function.name, t.function.parameters or NO_ARGUMENTS) for t in offered]
    spec = OutputSpec(
        constraint=constraint,
        tools=offers,
        tool_format=traits.tool_call_parser if offers else None,
        reasoning_format=traits.reasoning_parser if constraint is None else None,
    )
    return spec if spec != OutputSpec() else None


def _forced_schema(body: ToolFields, name: str | None) -> dict[str, Any]:
    """The JSON the output is constrained to for forced tool calls: the named function's
    arguments, or (``required``) an array of calls of any offered function."""
    tools = {t.function.name: t.function.parameters or NO_ARGUMENTS for t in body.tools or []}
    if name is not None:
        return tools[name]
    calls = [
        {
            "properties": {"name": {"type": "string", "enum": [tool]}, "parameters": params},
            "required": ["name", "parameters"],
        }
        for tool, params in tools.items()
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": calls},
    }
    if body.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def _checked(param: str, constraint: OutputConstraint, engine: str | None) -> OutputConstraint:
    if constraint.json_schema is not None:
        _check_schema(constraint.json_schema, param)
    why = refusal(engine, constraint)
    if why is not None:
        raise StructuredError(
            param,
            f"{param}: the model's engine ({engine or 'unknown'}) cannot enforce this "
            f"{constraint.kind()} constraint: {why}",
        )
    return constraint


def _check_schema(schema: dict[str, Any], param: str) -> None:
    problem = cached("schema", lambda: _schema_problem(schema), msgspec.json.encode(schema))
    if problem is not None:
        raise StructuredError(param, f"{param} is not a valid JSON Schema {problem}")


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """What is wrong with ``schema``, or None."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "the root"
        return f"(at {where}): {exc.message}"
    return None


def _choice_name(choice: Any) -> str:
    return choice.function.name if isinstance(choice, NamedToolChoice) else str(choice)
