"""A 500 that does happen (a bug) is OpenAI-shaped and says ``Connection: close`` before
the server closes the connection, on the hot routes and on the router's alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dynamoctl.component.http import BoundServer
from dynamoctl.frontend.app import build_app
from dynamoctl.frontend.metrics import FrontendMetrics
from tests.frontend.rawhttp import exchange, request


class _Broken:
    def get(self, name: str) -> object:
        raise RuntimeError("a bug")

    def models(self) -> list[object]:
        raise RuntimeError("a bug")


@pytest.fixture
async def broken() -> AsyncIterator[str]:
    app = build_app(_Broken(), None, FrontendMetrics())  # type: ignore[arg-type]
    server = BoundServer(app, "127.0.0.1", 0)
    task = asyncio.ensure_future(server.run_bound())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/completions", b'{"model": "m", "prompt": "x"}'),
        ("POST", "/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user"}]}'),
        ("GET", "/v1/models", b""),
    ],
)
async def test_500_says_connection_close(broken: str, method: str, path: str, body: bytes) -> None:
    reply = await exchange(broken, request(method, path, body))
    assert reply.status == 500
    assert reply.headers.get("connection") == "close"
    assert reply.closed
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "a bug" not in error["message"]  # internals stay in the log
