"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` as raw ASGI handlers beside
the chat ones (:class:`dynamoctl.frontend.app.FrontendApp` routes them): the same body
limits, refusal counting, admission, routing, migration and metrics (endpoint label
``messages``), and errors in Anthropic's shape (:func:`.events.error_body`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence

from starlette.responses import JSONResponse

from dynamoctl.frontend.anthropic.events import (
    BlockStream,
    error_body,
    event,
    message_blocks,
    stop_reason,
    usage,
)
from dynamoctl.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from dynamoctl.frontend.anthropic.translate import chat_fields, to_chat
from dynamoctl.frontend.asgi import Receive, Scope, Send, read_body
from dynamoctl.frontend.body import decode_body
from dynamoctl.frontend.choices import Choices, Delta
from dynamoctl.frontend.errors import OpenAIError, bad_request, internal_error
from dynamoctl.frontend.pipeline import ChatPipeline, chat_deltas, read_whole, serve_answer
from dynamoctl.frontend.protocol import ChatCompletionRequest

log = logging.getLogger(__name__)

ENDPOINT = "messages"


class AnthropicMessages:
    def __init__(self, chat: ChatPipeline) -> None:
        self.chat = chat

    async def refuse(self, scope: Scope, receive: Receive, send: Send, exc: OpenAIError) -> None:
        """Counts the refusal (as the other endpoints') and answers it in Anthropic's shape."""
        self.chat.refusals.refused("POST", scope["path"], exc)
        headers = dict(exc.headers)
        if exc.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        await JSONResponse(error_body(exc), exc.status, headers)(scope, receive, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        return await read_body(scope, receive, self.chat.max_body_bytes)

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``{"input_tokens": N}``: the prompt the conversation renders to, counted."""
        try:
            raw = await self._read(scope, receive)
            if raw is None:
                return
            body = decode_body(raw, CountTokensRequest)
            try:
                chat = ChatCompletionRequest.model_validate(chat_fields(body))
            except ValueError as exc:
                raise bad_request(str(exc), "messages") from None
            _, _, ids = await self.chat.chat_prompt(chat)
        except OpenAIError as exc:
            return await self.refuse(scope, receive, send, exc)
        await JSONResponse({"input_tokens": len(ids)})(scope, receive, send)

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await self._read(scope, receive)
            if raw is None:
                return
            body = decode_body(raw, MessagesRequest)
            model, choices = await self.chat.chat_choices(to_chat(body), f"msg_{uuid.uuid4().hex}")
        except OpenAIError as exc:
            return await self.refuse(scope, receive, send, exc)
        except Exception:
            log.exception("messages request failed")
            return await self.refuse(scope, receive, send, internal_error())
        answer = _Answer(body, model.name, choices)
        exchange = (scope, receive, send)
        await serve_answer(self.chat, ENDPOINT, model, choices, answer, body.stream, exchange)


class _Answer:
    """One request's answer, whole or streamed; a client that leaves cancels it."""

    def __init__(self, body: MessagesRequest, model: str, choices: Choices) -> None:
        self.body = body
        self.model = model
        self.choices = choices
        self.status: str | None = None
        self.cancelled = False

    def _message(self, content: Sequence[object], reason: str | None, sequence: str | None,
                 usage: dict[str, int]) -> dict[str, object]:  # fmt: skip
        return {
            "id": self.choices.request_id, "type": "message", "role": "assistant",
            "model": self.model, "content": content, "stop_reason": reason,
            "stop_sequence": sequence, "usage": usage,
        }  # fmt: skip

    async def whole(self, scope: Scope, receive: Receive, send: Send,
                    deltas: AsyncIterator[Delta]) -> None:  # fmt: skip
        pieces: list[str] = []
        try:
            if not await read_whole(receive, deltas, lambda piece: pieces.append(piece or "")):
                self.cancelled = True
                return
        except OpenAIError as exc:
            self.status = str(exc.status)
            await JSONResponse(error_body(exc), exc.status)(scope, receive, send)
            return
        text = "".join(pieces)
        outcome = self.choices.outcomes[0]
        shapers = self.choices.shapers
        message = shapers[0].message(text) if shapers else {"content": text}
        reason, sequence = stop_reason(outcome, bool(message.get("tool_calls")))
        blocks = message_blocks(message, self.body.thinks())
        whole = self._message(blocks, reason, sequence, usage(self.choices.prompt_tokens, outcome))
        await JSONResponse(whole)(scope, receive, send)

    def opening(self) -> list[bytes]:
        self.blocks = BlockStream(self.body.thinks())
        start = usage(self.choices.prompt_tokens, self.choices.outcomes[0])
        return [event("message_start", {"message": self._message([], None, None, start)})]

    def feed(self, piece: str | None) -> list[bytes]:
        return [e for delta in chat_deltas(self.choices, piece) for e in self.blocks.feed(delta)]

    def closing(self) -> list[bytes]:
        outcome = self.choices.outcomes[0]
        reason, sequence = stop_reason(outcome, self.blocks.tool_called)
        final = usage(self.choices.prompt_tokens, outcome)
        return [*self.blocks.close(), event("message_delta", {
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": final,
        }), event("message_stop", {})]  # fmt: skip

    def error(self, exc: OpenAIError) -> list[bytes]:  # Anthropic's error event
        return [event("error", {"error": error_body(exc)["error"]})]
