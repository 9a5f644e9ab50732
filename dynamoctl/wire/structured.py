"""Structured outputs and tool calls as they travel to engines (docs/api.md, "Structured
outputs, tools and reasoning").

A request's :class:`OutputSpec` rides on :attr:`GenerateRequest.output`: the constraint an
engine enforces by guided decoding, plus what a simulating engine (the mocker) needs to
produce output of the right shape. A worker's :class:`OutputTraits` rides on its model
card: which engine serves the model (what it can enforce) and which parsers read its
output.
"""

from __future__ import annotations

from typing import Any

import msgspec


class OutputConstraint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the output must match, enforced while sampling: exactly one field is set."""

    json_schema: dict[str, Any] | None = None
    """A JSON Schema (already checked to be one) the output must validate against."""
    json_object: bool = False
    """Any JSON object (``response_format: json_object``)."""
    regex: str | None = None
    """A regular expression the whole output must match."""
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """An EBNF grammar (vLLM, SGLang and TensorRT-LLM's dialects agree on the basics)."""

    def kind(self) -> str:
        """The set field's name (for messages and engine support)."""
        for name in ("json_schema", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"


class ToolOffer(msgspec.Struct, frozen=True, gc=False):
    """A function the client offers the model."""

    name: str
    parameters: dict[str, Any]
    """JSON Schema of its arguments."""


class OutputSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How one request's output is shaped. Real engines act on :attr:`constraint` only:
    the tools and the thinking are already in the prompt, through the chat template."""

    constraint: OutputConstraint | None = None
    """Enforced by guided decoding (``response_format``, ``structured_outputs``, or
    ``tool_choice: required`` / a named function)."""
    tools: list[ToolOffer] = []
    """Simulators: the model may call one of these (``tool_choice: auto``), written in
    :attr:`tool_format`."""
    tool_format: str | None = None
    """Simulators: the tool-call parser's name, i.e. how a call is written."""
    reasoning_format: str | None = None
    """Simulators: the reasoning parser's name; the model thinks (``<think>...``) first."""


class OutputTraits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the frontend needs to know about a model's output, on its model card."""

    engine: str | None = None
    """Engine adapter serving it (``vllm``, ``mocker``...): what it can enforce."""
    tool_call_parser: str | None = None
    """How the model writes tool calls (recipe ``model.tool_call_parser``)."""
    reasoning_parser: str | None = None
    """How the model writes its thinking (recipe ``model.reasoning_parser``)."""
