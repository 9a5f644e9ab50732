"""How a model writes tool calls and thinking: declared once, as the recipe's ``model``
fields and ``dynamoctl worker``'s flags; the worker puts them on its model card for the
frontend (docs/api.md, "Structured outputs, tools and reasoning")."""

from __future__ import annotations

from pydantic import field_validator

from dynamoctl.parsers import REASONING_PARSERS, TOOL_PARSERS
from dynamoctl.settings.base import Options
from dynamoctl.util.registry import Registry


def _known(registry: Registry[type], value: str | None) -> str | None:
    if value is not None and value not in registry:
        raise ValueError(f"unknown {registry.what} '{value}'; valid: {', '.join(registry)}")
    return value


class OutputParserSettings(Options):
    """The model's output formats."""

    tool_call_parser: str | None = None
    """How the model writes tool calls, named as vLLM's ``--tool-call-parser``:
    ``hermes`` (Hermes, Qwen 2.5/3), ``llama3_json`` (Llama 3.x) or ``mistral``. Needed
    for ``tool_choice: auto``; forced calls (``required``, a named function) work without
    it."""
    reasoning_parser: str | None = None
    """How the model writes its thinking, named as vLLM's ``--reasoning-parser``:
    ``deepseek_r1`` or ``qwen3``; answers then carry it as ``reasoning_content``."""

    @field_validator("tool_call_parser")
    @classmethod
    def _tool_parser(cls, value: str | None) -> str | None:
        return _known(TOOL_PARSERS, value)

    @field_validator("reasoning_parser")
    @classmethod
    def _reasoning_parser(cls, value: str | None) -> str | None:
        return _known(REASONING_PARSERS, value)
