"""Time for the mocker: simulated seconds, on a real or a virtual clock.

The engine never sleeps to fake work; it computes how long a step takes and waits for the
clock to reach the step's end. :class:`RealClock` maps simulated time onto the wall clock
(``speedup`` simulated seconds per real second); :class:`VirtualClock` jumps straight to
the deadline, so a test or a benchmark runs as fast as the simulation itself and every
timestamp is exact.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Simulated time in seconds since the clock was made."""

    def now(self) -> float:
        """Current simulated time."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return when the clock reaches ``deadline``; always yields to the event loop."""
        ...

    async def sleep(self, seconds: float) -> None:
        """``sleep_until(now() + seconds)``."""
        ...


class RealClock:
    """Simulated time runs ``speedup`` times faster than the wall clock.

    Resolution is the event loop's: timers fire up to ~1 ms of *real* time off (asyncio's
    epoll rounds up to whole milliseconds, uvloop's libuv rounds either way), i.e.
    ``speedup`` ms of simulated time. The engine schedules against absolute deadlines, so
    a late step is caught up by the next ones: rates are exact on average, single token
    times jitter by that much (1 s of simulated time at 1000x).
    """

    def __init__(self, speedup: float = 1.0) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.speedup = speedup
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, (deadline - self.now()) / self.speedup))

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.now() + seconds)


class VirtualClock:
    """Simulated time that advances only when someone sleeps: instantly, by exactly the
    amount asked.

    Give each engine its own: two engines sleeping on one clock would each move it to
    their own deadline and mix their timelines.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        self._now = max(self._now, deadline)
        await asyncio.sleep(0)

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward without sleeping (tests: let time pass while idle)."""
        self._now += max(0.0, seconds)
