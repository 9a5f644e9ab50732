"""The ASGI side of a request, below the router: the types the hot routes use, reading a
body within its limit, and noticing a client that went away (docs/frontend.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from dynamoctl.frontend.errors import too_large

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Disconnect:
    """Cancels the serving task when ``receive()`` reports the client gone.

    One pending ``receive()`` per request, with a callback: cheaper than a task group, and
    the cancellation lands wherever the request is waiting (for a worker, a token, the
    router's queue), as Starlette's disconnect listener does.
    """

    __slots__ = ("_receive", "_task", "_waiter", "gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task = asyncio.current_task()
        self.gone = False
        self._waiter: asyncio.Future[Message] | None = None
        self._arm()

    def _arm(self) -> None:
        self._waiter = asyncio.ensure_future(self._receive())
        self._waiter.add_done_callback(self._received)

    def _received(self, waiter: asyncio.Future[Message]) -> None:
        if waiter.cancelled() or self._waiter is None:
            return
        if waiter.exception() is not None:
            self._waiter = None
            return
        if waiter.result()["type"] != "http.disconnect":
            self._arm()
            return
        self._waiter = None
        self.gone = True
        if self._task is not None:
            self._task.cancel()

    def stop(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.remove_done_callback(self._received)
            waiter.cancel()

    def absorb(self) -> None:
        """The cancellation was ours: the request is over, the task goes on."""
        uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request body, or None if the client disconnects first; 413 past ``limit``."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = value.decode("latin-1")
            # Digits only (the HTTP parser checked), but maybe many: compare lengths first.
            if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
                raise too_large(limit)
            break
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            part = message.get("body", b"")
            if part:
                parts.append(part)
                size += len(part)
                if size > limit:
                    raise too_large(limit)
            if not message.get("more_body", False):
                return b"".join(parts)
        elif message["type"] == "http.disconnect":
            return None
