"""An Anthropic conversation as the chat request it means (:mod:`dynamoctl.frontend.protocol`),
so that it is templated, planned (tools, reasoning), routed and generated as any chat.

``system`` leads as a system message; a user message's ``tool_result`` blocks become
``tool`` messages (Anthropic sends them first in the message, answering the previous
turn's calls), its text a user message; an assistant message's ``tool_use`` blocks its
``tool_calls``. Earlier thinking is left out. ``tool_choice`` ``any`` is OpenAI's
``required``, ``tool`` a named function."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from dynamoctl.frontend.anthropic.protocol import (
    MessagesRequest,
    TextBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    _Conversation,
)
from dynamoctl.frontend.errors import bad_request
from dynamoctl.frontend.protocol import ChatCompletionRequest


def chat_messages(request: _Conversation) -> list[dict[str, Any]]:
    """The conversation as chat messages (OpenAI's shape)."""
    out: list[dict[str, Any]] = []
    system = request.system_text()
    if system:
        out.append({"role": "system", "content": system})
    for message in request.messages:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in message.blocks():
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": block.text()})  # fmt: skip
            elif isinstance(block, ToolUseBlock):
                function = {"name": block.name, "arguments": json.dumps(block.input)}
                calls.append({"id": block.id, "type": "function", "function": function})
        if texts or calls or not isinstance(message.content, list):
            chat: dict[str, Any] = {"role": message.role, "content": "".join(texts)}
            if calls:
                chat["tool_calls"] = calls
            out.append(chat)
    return out


def _tool_choice(choice: ToolChoice | None) -> Any:
    if choice is None:
        return None
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type  # auto, none


def chat_fields(request: _Conversation) -> dict[str, Any]:
    """The chat request's prompt fields: messages and tools."""
    fields: dict[str, Any] = {"model": request.model, "messages": chat_messages(request)}
    if request.tools:
        fields["tools"] = [
            {"type": "function", "function": {
                "name": t.name, "parameters": t.input_schema,
                **({"description": t.description} if t.description is not None else {}),
            }}
            for t in request.tools
        ]  # fmt: skip
        fields["tool_choice"] = _tool_choice(request.tool_choice)
        if request.tool_choice is not None and request.tool_choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    elif request.tool_choice is not None and request.tool_choice.type != "none":
        raise bad_request("tool_choice needs tools", "tool_choice")
    return fields


def to_chat(request: MessagesRequest) -> ChatCompletionRequest:
    """The chat completion request ``request`` means."""
    fields = chat_fields(request)
    fields["max_tokens"] = request.max_tokens
    fields["stream"] = request.stream
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    if request.stop_sequences:
        fields["stop"] = list(request.stop_sequences)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # Anthropic's model checked the rest: name its field
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"{where}: {first['msg']}", where or None) from None
