"""Asyncio building blocks shared across planes and components."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

_S = TypeVar("_S", bound="AsyncService")


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
