"""Tool-call formats: where a model's calls start in its output and how they parse.

Built in rather than borrowed: vLLM's parsers (``vllm.tool_parsers``) need vLLM's request
and tokenizer classes, and importing one costs the frontend ~20 s and ~600 MB (torch);
SGLang's need the whole of SGLang. The formats themselves are small and documented, so
each is a few lines here, named as vLLM names them so that a recipe says the same word as
``vllm serve --tool-call-parser`` (docs/api.md).

A parser only finds and reads calls; text it cannot read stays content (never an error).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dynamoctl.util.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    """One parsed call, as OpenAI returns it."""

    name: str
    arguments: str
    """The arguments as a JSON object's text."""
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def call_of(obj: Any, *argument_keys: str) -> ToolCall | None:
    """A call from a decoded ``{"name": ..., <argument key>: {...}}``, or None (an object
    without its arguments is some other JSON, not a call)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # some models double-encode
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            if not isinstance(args, dict):
                return None
            return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
    return None


class ToolParser:
    """A tool-call format. :meth:`start` finds where calls begin; :meth:`parse` reads the
    text from there to the end."""

    START: ClassVar[str]
    """The text that opens the calls (a stream holds back text that may begin it)."""
    END: ClassVar[str | None] = None
    """The text that closes one call, for formats that have one: each call is then parsed
    as soon as it closes; without, the calls run to the end of the answer."""

    def start(self, text: str) -> int | None:
        """Index in ``text`` where the calls begin, or None."""
        at = text.find(self.START)
        return None if at < 0 else at

    def parse(self, section: str) -> tuple[list[ToolCall], str] | None:
        """The calls in ``section`` (from :meth:`start` on) and any text around them that
        is content; None when it does not parse (it is then content as a whole)."""
        raise NotImplementedError

    def write(self, name: str, arguments: str) -> str:
        """A call as the model writes it (what the mocker emits)."""
        raise NotImplementedError


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool call parser")
"""Tool-call formats by name (recipe ``model.tool_call_parser``)."""


@TOOL_PARSERS.register("hermes")
class HermesParser(ToolParser):
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
    block per call; a last block cut short by the end of output is still read."""

    START = "<tool_call>"
    END = "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, section: str) -> tuple[list[ToolCall], str] | None:
        calls, rest = [], []
        end = 0
        for match in self._BLOCK.finditer(section):
            rest.append(section[end : match.start()])
            end = match.end()
            try:
                call = call_of(json.loads(match[1]), "arguments", "parameters")
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
        rest.append(section[end:])
        return (calls, "".join(rest).strip()) if calls else None

    def write(self, name: str, arguments: str) -> str:
        return (
            f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'
        )


@TOOL_PARSERS.register("llama3_json")
class Llama3JsonParser(ToolParser):
    """Llama 3.x JSON tool calling: the whole answer is ``{"name": ..., "parameters":
    {...}}`` (optionally after ``<|python_tag|>``), several separated by ``;``."""

    START = "{"
    _TAG = "<|python_tag|>"

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(self._TAG) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return None

    def parse(self, section: str) -> tuple[list[ToolCall], str] | None:
        text = section.strip().removeprefix(self._TAG).strip()
        decoder = json.JSONDecoder()
        calls, at = [], 0
        while at < len(text):
            try:
                obj, at = decoder.raw_decode(text, at)
            except ValueError:
                return None
            call = call_of(obj, "parameters", "arguments")
            if call is None:
                return None
            calls.append(call)
            at = len(text) - len(text[at:].lstrip().removeprefix(";").lstrip())
        return (calls, "") if calls else None

    def write(self, name: str, arguments: str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": {arguments}}}'


@TOOL_PARSERS.register("mistral")
class MistralParser(ToolParser):
    """Mistral: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}``."""

    START = "[TOOL_CALLS]"

    def parse(self, section: str) -> tuple[list[ToolCall], str] | None:
        body = section.removeprefix(self.START).strip()
        try:
            decoded, end = json.JSONDecoder().raw_decode(body)
        except ValueError:
            return None
        items = decoded if isinstance(decoded, list) else [decoded]
        calls = [call_of(item, "arguments", "parameters") for item in items]
        if not calls or any(call is None for call in calls):
            return None
        return [c for c in calls if c is not None], body[end:].strip()

    def write(self, name: str, arguments: str) -> str:
        return f'[TOOL_CALLS][{{"name": {json.dumps(name)}, "arguments": {arguments}}}]'


def held_back(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could begin ``marker`` (a stream holds
    them until the next delta says whether they do)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
