"""The admission queue's order under overload: classes by weight, keys of a class in turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from dynamoctl.frontend.tenants.fair import FairQueue, QueueTimeout


class Workers:
    """Free slots the test hands out one at a time; each served request is recorded."""

    def __init__(self) -> None:
        self.free = 0
        self.served: list[str] = []
        self.changed = asyncio.Event()

    def attempt(self, who: str) -> Callable[[], Awaitable[str | None]]:
        async def attempt() -> str | None:
            if self.free == 0:
                return None
            self.free -= 1
            self.served.append(who)
            self.changed.set()
            return who

        return attempt


async def serve_in_order(
    queue: FairQueue, waiters: list[tuple[str, float, str]], n: int
) -> list[str]:
    workers = Workers()
    deadline = time.monotonic() + 30
    tasks = [
        asyncio.create_task(queue.wait(c, w, key, workers.attempt(key), deadline))
        for c, w, key in waiters
    ]
    await asyncio.sleep(0.05)  # all have joined while no worker is free
    for _ in range(n):
        workers.changed.clear()
        workers.free = 1
        await asyncio.wait_for(workers.changed.wait(), 10)
    for task in tasks:
        task.cancel()
    # A cancelled waiter (its client gone) leaves at once, not at its deadline 30 s on.
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert queue.waiting == 0
    return workers.served


async def test_classes_by_weight_and_keys_in_turn() -> None:
    counts: dict[str, int] = {}
    queue = FairQueue(
        poll=0.001, on_change=lambda c, d: counts.__setitem__(c, counts.get(c, 0) + d)
    )
    batch = [("batch", 1.0, "nightly")] * 20 + [("batch", 1.0, "etl")] * 4
    waiters = batch + [("interactive", 3.0, "chat")] * 12  # the batch queued first
    served = await serve_in_order(queue, waiters, 16)
    assert served.count("chat") == 12, served  # 3 of every 4 while both wait
    assert served[:4].count("chat") == 3
    # Inside the batch class, the key with 4 waiting is not behind the one with 20.
    assert served.count("etl") == 2 and served.count("nightly") == 2, served
    assert counts == {"batch": 0, "interactive": 0}


async def test_one_class_is_first_come_first_served() -> None:
    queue = FairQueue(poll=0.001)
    waiters = [("default", 1.0, "") for _ in range(5)]
    workers = Workers()
    deadline = time.monotonic() + 30
    tasks = []
    for i in range(5):
        tasks.append(
            asyncio.create_task(queue.wait(*waiters[i], workers.attempt(str(i)), deadline))
        )
        await asyncio.sleep(0.005)
    workers.free = 5
    assert await asyncio.gather(*tasks) == ["0", "1", "2", "3", "4"]


async def test_a_waiter_times_out_and_the_next_moves_up() -> None:
    queue = FairQueue(poll=0.001)
    workers = Workers()
    soon = asyncio.create_task(
        queue.wait("a", 1.0, "k", workers.attempt("soon"), time.monotonic() + 0.05)
    )
    later = asyncio.create_task(
        queue.wait("a", 1.0, "k", workers.attempt("later"), time.monotonic() + 10)
    )
    with pytest.raises(QueueTimeout):
        await soon
    workers.free = 1
    assert await later == "later"


async def test_a_class_with_less_headroom_is_not_stuck_behind_one_refused() -> None:
    """The batch head is first in turn but refused (its class's headroom is full); the
    interactive head, whose class keeps none, tries beside it and gets the room."""
    queue = FairQueue(poll=0.001)
    deadline = time.monotonic() + 30
    batch_tries = 0

    async def batch_attempt() -> str | None:
        nonlocal batch_tries
        batch_tries += 1
        return None  # over the batch class's lowered threshold

    async def chat_attempt() -> str | None:
        return "chat"

    batch = asyncio.create_task(
        queue.wait("batch", 1.0, "nightly", batch_attempt, deadline, headroom=0.2)
    )
    await asyncio.sleep(0.01)
    chat = queue.wait("interactive", 8.0, "chat", chat_attempt, time.monotonic() + 1, 0.0)
    assert await asyncio.wait_for(chat, 2) == "chat"
    assert batch_tries > 0 and not batch.done()
    # A class with as much headroom as the head's waits behind it, as before.
    same = asyncio.create_task(
        queue.wait("bulk", 1.0, "etl", chat_attempt, time.monotonic() + 0.1, 0.2)
    )
    with pytest.raises(QueueTimeout):
        await same
    batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
    assert queue.waiting == 0
