"""``POST /v1/responses`` as a raw ASGI handler beside the chat ones (routed by
:class:`dynamoctl.frontend.app.FrontendApp`), and the stored responses' ``GET`` and
``DELETE``: the same body limits, refusals, admission, routing, migration and metrics
(endpoint label ``responses``) as chat completions, and OpenAI's error objects."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse

from dynamoctl.frontend.asgi import Receive, Scope, Send, read_body
from dynamoctl.frontend.body import decode_body
from dynamoctl.frontend.choices import Choices, Delta
from dynamoctl.frontend.errors import OpenAIError, internal_error
from dynamoctl.frontend.pipeline import ChatPipeline, chat_deltas, read_whole, serve_answer
from dynamoctl.frontend.responses.events import (
    OutputItems,
    ResponseObject,
    assistant_message,
    sse,
    usage,
)
from dynamoctl.frontend.responses.protocol import ResponsesRequest
from dynamoctl.frontend.responses.store import ResponseStore, Stored
from dynamoctl.frontend.responses.translate import to_chat

log = logging.getLogger(__name__)

ENDPOINT = "responses"


def not_found(response_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id[:100]}' not found.",
                       type="not_found_error", param=param)  # fmt: skip


class Responses:
    def __init__(self, chat: ChatPipeline, store: ResponseStore) -> None:
        self.chat = chat
        self.store = store

    def get(self, response_id: str) -> dict[str, Any]:
        kept = self.store.get(response_id)
        if kept is None:
            raise not_found(response_id)
        return kept.response

    def delete(self, response_id: str) -> dict[str, Any]:
        if not self.store.delete(response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(scope, receive, self.chat.max_body_bytes)
            if raw is None:
                return
            body = decode_body(raw, ResponsesRequest)
            history: list[dict[str, Any]] = []
            if body.previous_response_id is not None:
                kept = self.store.get(body.previous_response_id)
                if kept is None:
                    raise not_found(body.previous_response_id, "previous_response_id")
                history = kept.conversation
            chat, conversation = to_chat(body, history)
            model, choices = await self.chat.chat_choices(chat, f"resp_{_hex()}")
        except OpenAIError as exc:
            self.chat.refusals.refused("POST", scope["path"], exc)
            return await exc.response()(scope, receive, send)
        except Exception:
            log.exception("responses request failed")
            bug = internal_error()
            self.chat.refusals.refused("POST", scope["path"], bug)
            return await bug.response()(scope, receive, send)
        answer = _Answer(body, ResponseObject(body, choices.request_id, model.name), choices)
        exchange = (scope, receive, send)
        await serve_answer(self.chat, ENDPOINT, model, choices, answer, body.stream, exchange)
        if answer.final is not None and body.store:
            reply = assistant_message(answer.final["output"])
            self.store.put(Stored(answer.final, [*conversation, *([reply] if reply else [])]))


def _hex() -> str:
    return uuid.uuid4().hex


class _Answer:
    """One request's answer, whole or streamed; a client that leaves cancels it."""

    def __init__(self, body: ResponsesRequest, response: ResponseObject, choices: Choices) -> None:
        self.body = body
        self.response = response
        self.choices = choices
        self.items = OutputItems(response)
        self.status: str | None = None
        self.cancelled = False
        self.final: dict[str, Any] | None = None

    def _take(self, piece: str | None) -> None:
        for delta in chat_deltas(self.choices, piece):
            self.items.feed(delta)

    def _finish(self) -> dict[str, Any]:
        outcome = self.choices.outcomes[0]
        incomplete = "max_output_tokens" if outcome.finish_reason == "length" else None
        self.final = self.response.render(
            "incomplete" if incomplete else "completed",
            usage(self.choices.prompt_tokens, outcome),
            incomplete,
        )
        return self.final

    async def whole(self, scope: Scope, receive: Receive, send: Send,
                    deltas: AsyncIterator[Delta]) -> None:  # fmt: skip
        try:
            if not await read_whole(receive, deltas, self._take):
                self.cancelled = True
                return
        except OpenAIError as exc:
            self.status = str(exc.status)
            await exc.response()(scope, receive, send)
            return
        self.items.close()
        await JSONResponse(self._finish())(scope, receive, send)

    def opening(self) -> list[bytes]:
        started = self.response.render("in_progress")
        return [sse(self.items.event("response.created", response=started)),
                sse(self.items.event("response.in_progress", response=started))]  # fmt: skip

    def feed(self, piece: str | None) -> list[bytes]:
        return [
            sse(e) for delta in chat_deltas(self.choices, piece) for e in self.items.feed(delta)
        ]

    def closing(self) -> list[bytes]:
        events = self.items.close()
        final = self._finish()
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [*map(sse, events), sse(self.items.event(kind, response=final))]

    def error(self, exc: OpenAIError) -> list[bytes]:  # OpenAI's error event
        return [sse(self.items.event("error", code=exc.code, message=exc.message, param=exc.param))]
