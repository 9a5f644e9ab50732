"""Reading a model's raw output: tool calls and reasoning separated from the answer, by
the format the recipe names per model (docs/api.md, "Structured outputs, tools and
reasoning")."""

from dynamoctl.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dynamoctl.parsers.tools import TOOL_PARSERS, ToolCall, ToolParser

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "ReasoningParser", "ToolCall", "ToolParser"]
