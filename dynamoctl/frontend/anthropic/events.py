"""An answer in Anthropic's terms: the whole ``message`` object, or its stream of
events (``message_start``, a ``content_block_start`` / ``_delta`` / ``_stop`` run per
block, ``message_delta`` with the stop reason and usage, ``message_stop``).

A chat choice's deltas (:mod:`dynamoctl.parsers.shaper`: ``content``,
``reasoning_content``, ``tool_calls``) map to ``text``, ``thinking`` and ``tool_use``
blocks; thinking is shown only when the request enabled it (``thinking.type:
enabled``), as Anthropic's API does."""

from __future__ import annotations

import json
from typing import Any

from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.generate import Outcome

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
"""Anthropic's error type of each status; any other is ``api_error``."""


def error_body(error: OpenAIError) -> dict[str, Any]:
    """Anthropic's error object; ``param`` names the parameter at fault, as on the OpenAI
    endpoints (an extra key Anthropic's clients ignore)."""
    detail = {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}
    if error.param is not None:
        detail["param"] = error.param
    return {"type": "error", "error": detail}


def event(kind: str, data: dict[str, Any]) -> bytes:
    body = json.dumps({"type": kind, **data}, separators=(",", ":"))
    return f"event: {kind}\ndata: {body}\n\n".encode()


def stop_reason(outcome: Outcome, tool_called: bool) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a finished choice."""
    if tool_called:
        return "tool_use", None
    if outcome.finish_reason == "length":
        return "max_tokens", None
    if outcome.stop_string is not None:
        return "stop_sequence", outcome.stop_string
    return "end_turn", None


def usage(prompt_tokens: int, outcome: Outcome) -> dict[str, int]:
    """Anthropic counts cache reads apart from ``input_tokens``."""
    cached = min(outcome.cached_tokens, prompt_tokens)
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": outcome.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    """A whole chat tool call as a ``tool_use`` block (its arguments decoded)."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except ValueError:  # a forced call is schema-checked; a parsed one may be prose
        arguments = {"_raw": function["arguments"]}
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def message_blocks(message: dict[str, Any], thinks: bool) -> list[dict[str, Any]]:
    """A whole chat message's fields as content blocks: thinking, text, tool uses."""
    blocks: list[dict[str, Any]] = []
    if thinks and message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"],
                       "signature": ""})  # fmt: skip
    if message.get("content") or not message.get("tool_calls"):
        blocks.append({"type": "text", "text": message.get("content") or ""})
    blocks += [tool_use(call) for call in message.get("tool_calls") or []]
    return blocks


class BlockStream:
    """Turns a choice's chat deltas into content-block events, one block open at a time."""

    def __init__(self, thinks: bool) -> None:
        self.thinks = thinks
        self.index = -1
        self.open: str | None = None
        self.tool_called = False

    def feed(self, delta: dict[str, Any]) -> list[bytes]:
        if (text := delta.get("content")) is not None:
            return [*self._start("text", {"text": ""}), self._delta("text_delta", text=text)]
        if (thought := delta.get("reasoning_content")) is not None:
            if not self.thinks:
                return []
            start = self._start("thinking", {"thinking": "", "signature": ""})
            return [*start, self._delta("thinking_delta", thinking=thought)]
        events: list[bytes] = []
        for call in delta.get("tool_calls") or []:
            self.tool_called = True
            block = {"id": call["id"], "name": call["function"]["name"], "input": {}}
            events += self._start("tool_use", block, fresh=True)
            arguments = call["function"]["arguments"] or ""
            if arguments:
                events.append(self._delta("input_json_delta", partial_json=arguments))
        return events

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        if self.open == "thinking":  # a signature closes Anthropic's thinking blocks
            signature = self._delta("signature_delta", signature="")
            self.open = None
            return [signature, event("content_block_stop", {"index": self.index})]
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def _start(self, kind: str, block: dict[str, Any], fresh: bool = False) -> list[bytes]:
        if self.open == kind and not fresh:
            return []
        events = self.close()
        self.index += 1
        self.open = kind
        content = {"type": kind, **block}
        events.append(event("content_block_start", {"index": self.index,
                                                    "content_block": content}))  # fmt: skip
        return events

    def _delta(self, kind: str, **fields: str) -> bytes:
        return event("content_block_delta", {"index": self.index,
                                             "delta": {"type": kind, **fields}})  # fmt: skip
