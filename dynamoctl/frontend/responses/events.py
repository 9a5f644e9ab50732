"""An answer as a Responses API object: output items (``reasoning``, ``message``,
``function_call``) and, streamed, the typed events that build them
(``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ... ``response.completed``), each with its
``sequence_number``. The whole answer goes through the same item builder as a stream,
so both carry the same items."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from dynamoctl.frontend.generate import Outcome
from dynamoctl.frontend.responses.protocol import ResponsesRequest

Event = dict[str, Any]


def sse(event: Event) -> bytes:
    body = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {body}\n\n".encode()


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseObject:
    """The response object of one request, as it grows."""

    def __init__(self, request: ResponsesRequest, response_id: str, model: str) -> None:
        self.request = request
        self.id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []

    def render(self, status: str, usage: dict[str, Any] | None = None,
               incomplete: str | None = None) -> dict[str, Any]:  # fmt: skip
        request = self.request
        fmt = request.text.format.model_dump(by_alias=True) if request.text else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
            "model": self.model, "output": list(self.output),
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": request.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": request.store,
            "temperature": request.temperature, "top_p": request.top_p,
            "text": {"format": fmt},
            "tool_choice": _tool_choice(request),
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or []],
            "truncation": "disabled", "usage": usage, "user": request.user,
            "metadata": request.metadata or {},
        }  # fmt: skip


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if choice is None:
        return "auto" if request.tools else "none"
    return choice if isinstance(choice, str) else choice.model_dump()


def usage(prompt_tokens: int, outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + outcome.completion_tokens,
    }


class OutputItems:
    """Turns a chat choice's deltas (``content``, ``reasoning_content``, ``tool_calls``)
    into output items, one open at a time, and the events that announce them."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.open: dict[str, Any] | None = None
        self.text = ""
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def feed(self, delta: dict[str, Any]) -> list[Event]:
        if (text := delta.get("content")) is not None:
            return [*self._start("message"), self._text_delta("response.output_text.delta", text)]
        if (thought := delta.get("reasoning_content")) is not None:
            delta_kind = "response.reasoning_text.delta"
            return [*self._start("reasoning"), self._text_delta(delta_kind, thought)]
        events = self.close()
        for call in delta.get("tool_calls") or []:
            function = call["function"]
            item = {"id": _id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": call["id"], "name": function["name"], "arguments": ""}  # fmt: skip
            self.response.output.append(item)
            where = {"item_id": item["id"], "output_index": self._index}
            arguments = function["arguments"] or ""
            events.append(self.event("response.output_item.added",
                                     output_index=self._index, item=dict(item)))  # fmt: skip
            events.append(self.event("response.function_call_arguments.delta", **where,
                                     delta=arguments))  # fmt: skip
            item.update(arguments=arguments, status="completed")
            events.append(self.event("response.function_call_arguments.done", **where,
                                     name=item["name"], arguments=arguments))  # fmt: skip
            events.append(self.event("response.output_item.done",
                                     output_index=self._index, item=dict(item)))  # fmt: skip
        return events

    def close(self) -> list[Event]:
        item = self.open
        if item is None:
            return []
        self.open = None
        where = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            done = self.event("response.output_text.done", **where, text=self.text, logprobs=[])
        else:
            part = {"type": "reasoning_text", "text": self.text}
            done = self.event("response.reasoning_text.done", **where, text=self.text)
        item["content"] = [part]
        if item["type"] == "message":
            item["status"] = "completed"
        return [
            done,
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=self._index, item=dict(item)),
        ]

    def _start(self, kind: str) -> list[Event]:
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self.close()
        if kind == "message":
            item: dict[str, Any] = {"id": _id("msg"), "type": "message", "status": "in_progress",
                                    "role": "assistant", "content": []}  # fmt: skip
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [],
                                    "logprobs": []}  # fmt: skip
        else:
            item = {"id": _id("rs"), "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self.response.output.append(item)
        self.open, self.text = item, ""
        events.append(self.event("response.output_item.added", output_index=self._index,
                                 item={**item, "content": []}))  # fmt: skip
        events.append(self.event("response.content_part.added", item_id=item["id"],
                                 output_index=self._index, content_index=0, part=part))  # fmt: skip
        return events

    def _text_delta(self, kind: str, text: str) -> Event:
        self.text += text
        assert self.open is not None
        where = {"item_id": self.open["id"], "output_index": self._index, "content_index": 0}
        extra: dict[str, Any] = {"logprobs": []} if kind == "response.output_text.delta" else {}
        return self.event(kind, **where, delta=text, **extra)


def assistant_message(output: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The output as the chat message a next turn's prompt holds (reasoning left out)."""
    content = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {"id": i["call_id"], "type": "function",
         "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output if i["type"] == "function_call"
    ]  # fmt: skip
    if not content and not calls:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message
