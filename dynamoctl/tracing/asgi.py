"""The frontend's tracing middleware: installed only when tracing is on, so a frontend
without it runs no tracing code at all for a request."""

from __future__ import annotations

from typing import Any

from dynamoctl.tracing import TRACE
from dynamoctl.tracing.spans import Tracer

Scope = dict[str, Any]
Message = dict[str, Any]

TRACED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/embeddings",
    }
)
"""The requests that reach workers; the rest (models, health, metrics) are not traced."""


class TracingMiddleware:
    """Starts each inference request's root span (continuing the client's
    ``traceparent``) and makes it the request's :data:`TRACE`."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in TRACED_PATHS:
            await self.app(scope, receive, send)
            return
        request = self.tracer.request(f"{scope['method']} {scope['path']}", scope["headers"])

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.responded(message["status"])
            await send(message)

        token = TRACE.set(request)
        error: BaseException | None = None
        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            error = exc
            raise
        finally:
            TRACE.reset(token)
            request.end(error)
