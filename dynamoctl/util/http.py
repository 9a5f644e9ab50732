"""Serving an ASGI app from inside a component's own event loop."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


class BoundServer(uvicorn.Server):
    """A uvicorn server on a socket bound up front, so port 0 yields a known port, and
    without uvicorn's signal handling: the component owns SIGTERM/SIGINT (a signal means
    drain, and HTTP keeps answering meanwhile)."""

    def __init__(self, app: Any, host: str, port: int, **config: Any) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        super().__init__(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **config)
        )
        self.sock = sock
        self.host = host
        self.port = int(sock.getsockname()[1])

    async def run_bound(self) -> None:
        await self.serve(sockets=[self.sock])

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
