"""Asyncio building blocks shared across planes and components."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

_S = TypeVar("_S", bound="AsyncService")
_T = TypeVar("_T")


class AsyncService:
    """Something with ``start()`` and ``close()``; ``async with`` starts it and always
    closes it, whatever ends the block."""

    async def start(self) -> None:
        """Nothing to start unless a subclass says otherwise."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _S) -> _S:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class BackgroundTasks:
    """Tasks started and not awaited by their starter, held until they end (the event loop
    keeps only weak references to tasks, so an unheld one may be collected mid-run)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on uvloop when it is installed (it is a dependency on Linux and
    macOS): a faster event loop for the processes that serve traffic."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows: plain asyncio works, only slower
        return asyncio.run(main)
    return uvloop.run(main)


async def bounded(awaitable: Awaitable[_T], seconds: float) -> _T:
    """``await awaitable`` for at most ``seconds`` (then :class:`TimeoutError`).

    Unlike ``asyncio.wait_for`` before Python 3.12, it never swallows the caller's own
    cancellation: ``wait_for`` returns the result when that cancellation arrives just as
    the awaited call completes, and the cancelled task then runs on (a discovery watch
    cancelled while re-creating its etcd watch went on waiting for events)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def raise_if_cancel_requested() -> None:
    """Raise :class:`asyncio.CancelledError` if the current task was asked to cancel and
    the request got lost on the way (a library swallowed it): a loop that re-creates
    what it waits on calls this each round, so it cannot outlive its cancellation."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    if cancelling is not None and cancelling() > 0:
        raise asyncio.CancelledError()
