"""A chat answer's text turned into OpenAI's message parts: ``reasoning_content``,
``content`` and ``tool_calls``, streamed as deltas or whole.

One state machine serves both (the whole answer is the stream's deltas merged), so a
streamed and a non-streamed request never disagree. Text that might begin a tag (``</thi``)
is held until the next delta says; everything held is released at the end. Tool calls go
out as one delta each as soon as they have parsed (when they close, or when the answer
ends for formats without a closing tag); a call that does not parse is content
(docs/api.md).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from dynamoctl.parsers.reasoning import ReasoningParser
from dynamoctl.parsers.tools import Llama3JsonParser, ToolCall, ToolParser, call_of, held_back

MessageDelta = dict[str, Any]
"""One streamed ``delta`` of a chat choice: ``reasoning_content``, ``content`` or
``tool_calls``."""


@dataclass(frozen=True)
class ForcedCall:
    """``tool_choice`` ``required`` (``name`` None: a JSON array of ``{"name",
    "parameters"}``) or a named function (the output is its arguments object): the
    output was constrained to JSON (:mod:`dynamoctl.structured.plan`), not a format."""

    name: str | None = None

    def parse(self, text: str) -> list[ToolCall] | None:
        try:
            decoded = json.loads(text)
        except ValueError:
            return None
        if self.name is not None:
            if not isinstance(decoded, dict):
                return None
            return [ToolCall(self.name, json.dumps(decoded, ensure_ascii=False))]
        if not isinstance(decoded, list):
            return None
        calls = [call_of(item, "parameters", "arguments") for item in decoded]
        return None if not calls or None in calls else [c for c in calls if c is not None]


class _Thinking:
    """Splits the head of the output that is thinking from the answer."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.state = "undecided"  # -> thinking -> after (newlines) -> answer
        self.buf = ""

    def push(self, text: str) -> tuple[str, str]:
        """``(reasoning, answer)`` that ``text`` completes."""
        p, self.buf = self.parser, self.buf + text
        if self.state == "undecided":
            body = self.buf.lstrip()
            if body.startswith(p.START):
                self.state, self.buf = "thinking", body[len(p.START) :]
            elif p.START.startswith(body):
                return "", ""
            else:
                self.state = "thinking" if p.STARTS_THINKING else "answer"
        reasoning = ""
        if self.state == "thinking":
            thought, closed, rest = self.buf.partition(p.END)
            if not closed:
                keep = held_back(self.buf, p.END)
                cut = len(self.buf) - keep
                reasoning, self.buf = self.buf[:cut], self.buf[cut:]
                return reasoning, ""
            reasoning, self.state, self.buf = thought, "after", rest
        if self.state == "after":
            self.buf = self.buf.lstrip("\n")
            if not self.buf:
                return reasoning, ""
            self.state = "answer"
        answer, self.buf = self.buf, ""
        return reasoning, answer

    def close(self) -> tuple[str, str]:
        held, self.buf = self.buf, ""
        if self.state == "thinking" or (self.state == "undecided" and self.parser.STARTS_THINKING):
            return held, ""
        return "", "" if self.state == "after" else held


Part = str | ToolCall
"""A piece of the answer, in order: content, or a parsed call."""


class _Calls:
    """Finds tool calls in the answer in a format (``tool_choice: auto``). A format whose
    calls close (Hermes' ``</tool_call>``) has each call parsed as soon as it closes;
    the others' when the answer ends. A call of a function that was not offered is not a
    call: its text stays content."""

    def __init__(self, parser: ToolParser, offered: Collection[str]) -> None:
        self.parser = parser
        self.offered = offered
        self.buf = ""
        self.section: str | None = None  # from a call's start on, once found
        self.possible = True  # False once calls can no longer start (Llama 3: not first)

    def push(self, text: str) -> list[Part]:
        """The content and calls ``text`` completes, in order."""
        parts: list[Part] = []
        while True:
            if self.section is None:
                parts.append(self._before_start(text))
                text = ""
                if self.section is None:
                    return parts
            self.section += text
            text = ""
            closer = self.parser.END
            at = -1 if closer is None else self.section.find(closer)
            if closer is None or at < 0:
                return parts
            block, text = self.section[: at + len(closer)], self.section[at + len(closer) :]
            self.section = None
            parts += self._parsed(block)

    def close(self) -> list[Part]:
        held, self.buf = self.buf, ""
        if self.section is None:
            return [held]
        section, self.section = self.section, None
        return [held, *self._parsed(section)]

    def _parsed(self, section: str) -> list[Part]:
        parsed = self.parser.parse(section)
        if parsed is None:
            return [section]  # not a call after all: the model's text, as it is
        calls, rest = parsed
        if any(call.name not in self.offered for call in calls):
            return [section]
        return [*calls, rest]

    def _before_start(self, text: str) -> str:
        """The content before a call starts (sets :attr:`section` when one does)."""
        if not self.possible:
            return text
        self.buf += text
        at = self.parser.start(self.buf)
        if at is not None:
            content, self.section, self.buf = self.buf[:at], self.buf[at:], ""
            return content
        if isinstance(self.parser, Llama3JsonParser):  # a call is the whole answer
            head = self.buf.lstrip()
            if head and not Llama3JsonParser._TAG.startswith(head):
                self.possible = False
                content, self.buf = self.buf, ""
                return content
            return ""
        keep = held_back(self.buf, self.parser.START)
        content, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        return content


class ChatShaper:
    """One chat answer's reasoning, content and tool calls."""

    def __init__(
        self,
        reasoning: ReasoningParser | None = None,
        tools: ToolParser | None = None,
        forced: ForcedCall | None = None,
        parallel_tool_calls: bool = True,
        offered: Collection[str] = (),
    ) -> None:
        """``offered``: the names of the request's functions (``tools``)."""
        self.thinking = _Thinking(reasoning) if reasoning is not None else None
        self.calls = _Calls(tools, offered) if tools is not None and forced is None else None
        self.forced = forced
        self.forced_text = ""
        self.parallel = parallel_tool_calls
        self.called = 0
        """Tool calls sent so far (finish reason ``tool_calls`` when any)."""

    def push(self, text: str) -> list[MessageDelta]:
        """The deltas ``text`` completes (possibly none while a tag may be starting)."""
        reasoning, answer = self.thinking.push(text) if self.thinking else ("", text)
        return self._deltas(reasoning, self._answer(answer))

    def close(self) -> list[MessageDelta]:
        """What is left once the output has ended."""
        reasoning, answer = self.thinking.close() if self.thinking else ("", "")
        parts = self._answer(answer)
        if self.forced is not None:
            calls = self.forced.parse(self.forced_text)
            parts += calls if calls is not None else [self.forced_text]
        elif self.calls is not None:
            parts += self.calls.close()
        return self._deltas(reasoning, parts)

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.called and reason == "stop" else reason

    def message(self, text: str) -> dict[str, Any]:
        """The whole answer's message fields (``content``, ``reasoning_content``,
        ``tool_calls``), from the same deltas a stream would send."""
        parts: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
        for delta in [*self.push(text), *self.close()]:
            for key, value in delta.items():
                parts[key] += value
        for call in parts["tool_calls"]:
            call.pop("index")
        content = parts["content"]
        if parts["tool_calls"] and not content.strip():
            content = None  # as OpenAI: a message that only calls tools has no content
        message: dict[str, Any] = {"content": content}
        if self.thinking is not None:
            message["reasoning_content"] = parts["reasoning_content"] or None
        if parts["tool_calls"]:
            message["tool_calls"] = parts["tool_calls"]
        return message

    def _answer(self, answer: str) -> list[Part]:
        if self.forced is not None:
            self.forced_text += answer
            return []
        return self.calls.push(answer) if self.calls is not None else [answer]

    def _deltas(self, reasoning: str, parts: list[Part]) -> list[MessageDelta]:
        deltas: list[MessageDelta] = [{"reasoning_content": reasoning}] if reasoning else []
        for part in parts:
            if isinstance(part, ToolCall):
                if self.parallel or not self.called:  # parallel_tool_calls: false keeps one
                    deltas.append({"tool_calls": [part.to_openai(self.called)]})
                    self.called += 1
            elif part:
                deltas.append({"content": part})
        return deltas
