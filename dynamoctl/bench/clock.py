"""Clocks the load generator runs on: the event loop's time, real or virtual.

The scheduler and the client only ever ask a clock for ``now()`` and to
``sleep_until(t)``. ``LoopClock`` answers with the running event loop's time, so on a
``VirtualTimeLoop`` everything (arrivals, think times, timeouts, ``asyncio.wait``) runs in
virtual time: whenever no task is ready, the loop jumps to its next timer instead of
waiting. Trace replay and Poisson arrivals are checked that way, exactly and instantly.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return at ``when`` (at once if it has passed)."""
        ...


class LoopClock:
    """The running event loop's clock (``time.monotonic`` on a normal loop)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, when: float) -> None:
        delay = when - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)


class _InstantSelector(selectors.DefaultSelector):
    """Polls instead of blocking, and tells the loop how long it would have blocked."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if not events and timeout and self.loop is not None:
            self.loop.virtual_now += timeout
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time moves only when nothing is ready to run: a discrete-event
    simulation of the coroutines on it. Sockets still work (polled), but time spent
    waiting on them is not counted, so use it for code whose waits are timers."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _InstantSelector()
        self.virtual_now = start
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.virtual_now
