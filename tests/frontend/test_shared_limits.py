"""Shared limits (frontend/tenants/shared.py) between several frontend processes' sides,
each its own store connection to one real embedded discovery file: what the deployment
admits is one key's limit, not one per process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamoctl.discovery.embedded import EmbeddedStore
from dynamoctl.frontend.tenants.limits import KeyLimiter
from dynamoctl.frontend.tenants.shared import SharedLimits
from dynamoctl.settings.keyfile import KeyEntry, Limits

NS = "t"


def entry(**limits: int) -> KeyEntry:
    return KeyEntry(name="alice", key="sk-alice", limits=Limits(**limits))


@pytest.fixture
async def sides(tmp_path: Path) -> AsyncIterator[list[SharedLimits]]:
    stores = [EmbeddedStore(tmp_path) for _ in range(3)]
    yield [SharedLimits(store, NS, f"fe-{n}", processes=3) for n, store in enumerate(stores)]
    for store in stores:
        await store.close()


async def test_requests_per_minute_hold_across_processes(sides: list[SharedLimits]) -> None:
    limiters = [KeyLimiter(entry(requests_per_minute=300), granted=True) for _ in sides]
    admitted = 0
    for _ in range(200):  # round robin over the three processes
        for side, limiter in zip(sides, limiters, strict=True):
            if await side.admit(limiter) is None:
                admitted += 1
                limiter.release()
                side.finished(limiter)
    # One bucket of 300 for the deployment, refilled 5/s while this runs; each process
    # may hold one grant (3) unspent.
    assert 300 - 3 * 3 <= admitted <= 300 + 10, admitted


async def test_tokens_overrun_is_handed_back(sides: list[SharedLimits]) -> None:
    one, two = sides[0], sides[1]
    first, second = (KeyLimiter(entry(tokens_per_minute=1000), granted=True) for _ in (1, 2))
    assert await one.admit(first) is None
    assert first.tokens is not None
    first.spend(900)  # a long answer: far beyond its grant of 10
    first.release()
    one.finished(first)
    await one.close()
    # The shared bucket has 1000 - 900 - 10 (+ refill) left: the other process may take
    # about 90 more tokens, not 990.
    served = 0
    while await two.admit(second) is None and served < 1000:
        second.spend(10)
        served += 10
        second.release()
        two.finished(second)
        await two.close()
    assert 80 <= served <= 120, served


async def test_concurrent_requests_hold_across_processes(sides: list[SharedLimits]) -> None:
    limiters = [KeyLimiter(entry(concurrent_requests=2), granted=True) for _ in sides]
    results = await asyncio.gather(*(s.admit(lim) for s, lim in zip(sides, limiters, strict=True)))
    assert sum(r is None for r in results) == 2
    refused = next(r for r in results if r is not None)
    assert refused[0] == "concurrency" and refused[1].status == 429
    held = [(s, lim) for s, lim, r in zip(sides, limiters, results, strict=True) if r is None]
    side, limiter = held[0]
    limiter.release()
    side.finished(limiter)
    await side.close()  # its slot is back
    waiting = next(i for i, r in enumerate(results) if r is not None)
    assert await sides[waiting].admit(limiters[waiting]) is None


async def test_remaining_header_counts_the_shared_bucket(sides: list[SharedLimits]) -> None:
    one, two = sides[0], sides[1]
    first, second = (KeyLimiter(entry(requests_per_minute=300), granted=True) for _ in (1, 2))
    for _ in range(10):
        assert await one.admit(first) is None
    assert await two.admit(second) is None
    remaining = dict(second.headers())[b"x-ratelimit-remaining-requests"]
    # 300 less the 11 admitted (and a refill of 5/s while this ran), not the process's
    # own part of its grant (2).
    assert 285 <= int(remaining) <= 295, remaining
