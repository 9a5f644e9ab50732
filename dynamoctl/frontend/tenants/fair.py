"""Fair share of busy workers (docs/security.md, "Priority classes"): the requests
waiting for a worker are served by class in proportion to the classes' weights (stride
scheduling: each class has a pass that grows by 1/weight per request served, and the
waiting class with the lowest pass goes next), and inside a class by key in turn (round
robin), so that one key's thousand waiting requests do not stand before another's one.

Only the request at the head of this order tries the workers; the others wait on an event,
so N waiting requests cost one pick per poll, not N. A class that starts waiting again
joins at the pass of the last request served: what it did not use while idle is not
saved up.

A class may keep ``headroom`` (the last part of each worker's busy threshold it may not
fill): a worker too busy for it may still take a class with less. So the head of a later
class with less headroom than every class before it tries too, or an interactive request
would wait behind a batch head that the router refuses while room is kept for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


class QueueTimeout(Exception):
    """The request waited its whole deadline without reaching a worker."""


@dataclass(eq=False)
class _Waiter:
    class_name: str
    key: str
    woken: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Class:
    weight: float
    passed: float = 0.0
    headroom: float = 0.0
    keys: OrderedDict[str, deque[_Waiter]] = field(default_factory=OrderedDict)


@dataclass
class FairQueue:
    """The waiting requests of one model, in fair order."""

    poll: float = 0.02
    """Seconds between the head's tries while every worker is busy."""
    on_change: Callable[[str, int], None] | None = None
    """Told each change (+1, -1) of a class's waiting requests (``/metrics``)."""
    _classes: dict[str, _Class] = field(default_factory=dict)
    _clock: float = 0.0
    """The pass of the last request served."""
    waiting: int = 0

    async def wait(
        self,
        class_name: str,
        weight: float,
        key: str,
        attempt: Callable[[], Awaitable[T | None]],
        deadline: float,
        headroom: float = 0.0,
        check: Callable[[], None] | None = None,
    ) -> T:
        """Wait in turn until ``attempt`` returns a value when this request is one of the
        heads; raise :class:`QueueTimeout` at ``deadline`` (monotonic), and what
        ``attempt`` raises. ``headroom``: its class's (see the module doc). ``check``:
        called whenever the waiter wakes (:meth:`wake_all` included); what it raises
        ends the wait (the request's key was revoked)."""
        waiter = _Waiter(class_name, key)
        self._join(waiter, weight, headroom)
        try:
            while True:
                if check is not None:
                    check()
                if waiter in self._heads():
                    found = await attempt()
                    if found is not None:
                        self._served(waiter)
                        return found
                    if time.monotonic() >= deadline:
                        raise QueueTimeout
                    await asyncio.sleep(self.poll)
                    continue
                waiter.woken.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueTimeout
                # A timer wakes the waiter at its deadline (the loop's next turn raises);
                # not wait_for: Python 3.10/3.11's wait_for loses a cancellation (a
                # client gone) that lands as the event is set, and the cancelled waiter
                # then sat in the queue until its deadline.
                timer = asyncio.get_running_loop().call_later(left, waiter.woken.set)
                try:
                    await waiter.woken.wait()
                finally:
                    timer.cancel()
        finally:
            self._leave(waiter)

    def wake_all(self) -> None:
        """Wake every waiter once, so that each runs its ``check``."""
        for klass in self._classes.values():
            for waiters in klass.keys.values():
                for waiter in waiters:
                    waiter.woken.set()

    def _join(self, waiter: _Waiter, weight: float, headroom: float) -> None:
        klass = self._classes.get(waiter.class_name)
        if klass is None:
            klass = self._classes[waiter.class_name] = _Class(weight, self._clock)
        elif not klass.keys:  # idle until now: no credit saved up
            klass.passed = max(klass.passed, self._clock)
        klass.weight, klass.headroom = weight, headroom  # a reloaded key file may change them
        klass.keys.setdefault(waiter.key, deque()).append(waiter)
        self._counted(waiter.class_name, +1)
        self._wake_head()

    def _heads(self) -> list[_Waiter]:
        """The waiters that try the workers: the head of the class with the lowest pass,
        then each later class's head whose class keeps less headroom than all before it."""
        heads: list[_Waiter] = []
        least = 1.0
        for klass in sorted((c for c in self._classes.values() if c.keys), key=_pass):
            if not heads or klass.headroom < least:
                heads.append(klass.keys[next(iter(klass.keys))][0])
                least = klass.headroom
        return heads

    def _served(self, waiter: _Waiter) -> None:
        """The head got a worker: its class's pass grows, its key goes to the back."""
        klass = self._classes[waiter.class_name]
        self._clock = klass.passed
        klass.passed += 1.0 / klass.weight
        klass.keys.move_to_end(waiter.key)

    def _leave(self, waiter: _Waiter) -> None:
        klass = self._classes[waiter.class_name]
        queue = klass.keys[waiter.key]
        queue.remove(waiter)
        if not queue:
            del klass.keys[waiter.key]
        self._counted(waiter.class_name, -1)
        self._wake_head()

    def _wake_head(self) -> None:
        for head in self._heads():
            head.woken.set()

    def _counted(self, class_name: str, change: int) -> None:
        self.waiting += change
        if self.on_change is not None:
            self.on_change(class_name, change)


def _pass(klass: _Class) -> float:
    return klass.passed
