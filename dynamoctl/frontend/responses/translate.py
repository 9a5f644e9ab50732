"""A Responses request as the chat request it means (:mod:`dynamoctl.frontend.protocol`).

The prompt is the stored conversation it continues (``previous_response_id``), then
``instructions`` as a leading system message (for this response only), then its input
items: messages as they are, function calls as an assistant message's ``tool_calls``
(consecutive calls join one message), their outputs as ``tool`` messages; reasoning items
are left out, as the chat templates drop earlier thinking."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dynamoctl.frontend.errors import bad_request
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.frontend.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    NamedFunction,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as chat messages."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    out: list[dict[str, Any]] = []
    for item in request.input:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return out


def _format(request: ResponsesRequest) -> dict[str, Any] | None:
    fmt = request.text.format if request.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return {"type": "json_object"}
    if isinstance(fmt, TextFormatJsonSchema):
        spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.description is not None:
            spec["description"] = fmt.description
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        return {"type": "json_schema", "json_schema": spec}
    return None


def to_chat(
    request: ResponsesRequest, history: list[dict[str, Any]]
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request, and the conversation to store with its answer (without the
    instructions)."""
    conversation = [*history, *input_messages(request)]
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    fields: dict[str, Any] = {"model": request.model, "messages": [*system, *conversation]}
    fields["stream"] = request.stream
    if request.max_output_tokens is not None:
        fields["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if (value := getattr(request, name)) is not None:
            fields[name] = value
    if request.tools:
        fields["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in request.tools
        ]
    choice = request.tool_choice
    if isinstance(choice, NamedFunction):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        fields["tool_choice"] = choice
    if (fmt := _format(request)) is not None:
        fields["response_format"] = fmt
    try:
        return ChatCompletionRequest.model_validate(fields), conversation
    except ValidationError as exc:  # the Responses model checked the rest: name the field
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"{where}: {first['msg']}", where or None) from None
