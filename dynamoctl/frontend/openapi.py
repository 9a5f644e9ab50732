"""``/openapi.json``: the frontend's routes and the request schemas of those that take a
JSON body, built from the route table on first request.

Starlette serves the routes; FastAPI, which we used for this document alone, cost every
frontend start importing its own OpenAPI models (docs/architecture.md, "Dependencies").
The request models are pydantic's, so their JSON schemas are pydantic's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from dynamoctl import __version__
from dynamoctl.frontend.asgi import ASGIApp, Receive, Scope, Send

OPENAPI_VERSION = "3.1.0"


class RawRoute(Route):
    """A POST route whose handler is a raw ASGI app (it reads the body and writes the
    answer itself), with the model its JSON body is validated against."""

    def __init__(self, path: str, handler: ASGIApp, body: type[BaseModel]) -> None:
        async def endpoint(request: Request) -> Response:
            return _Raw(handler)

        super().__init__(path, endpoint, methods=["POST"])
        self.body = body


class _Raw(Response):
    """Hands the whole exchange to a raw ASGI handler."""

    def __init__(self, handler: ASGIApp) -> None:
        self.handler = handler
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


class OpenApi:
    """The document of ``routes`` (built once, when first asked for)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.routes = routes
        self._document: dict[str, Any] | None = None

    async def serve(self, request: Request) -> Response:
        if self._document is None:
            self._document = self.document()
        return JSONResponse(self._document)

    def document(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for route in self.routes:
            if not isinstance(route, Route) or route.path == "/openapi.json":
                continue
            for method in sorted(route.methods or ()):
                if method == "HEAD":  # Starlette's, beside every GET
                    continue
                operation: dict[str, Any] = {"responses": {"200": {"description": "OK"}}}
                if isinstance(route, RawRoute):
                    schema = route.body.model_json_schema()
                    operation["requestBody"] = {
                        "required": True,
                        "content": {"application/json": {"schema": schema}},
                    }
                paths.setdefault(route.path, {})[method.lower()] = operation
        return {
            "openapi": OPENAPI_VERSION,
            "info": {"title": "dynamoctl", "version": __version__},
            "paths": paths,
        }
