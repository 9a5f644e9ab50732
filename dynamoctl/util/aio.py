"""Asyncio building blocks shared across planes and components."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on uvloop when it is installed (it is a dependency on Linux and
    macOS): a faster event loop for the processes that serve traffic."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows: plain asyncio works, only slower
        return asyncio.run(main)
    return uvloop.run(main)
