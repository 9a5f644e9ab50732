"""Held deletions (dynamoctl/discovery/hold.py) over a real embedded store's watch: what a
consumer sees while discovery is settling, and that nothing is held once it has settled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, EventKind, WatchEvent, store_from_url
from dynamoctl.discovery.hold import address_answers, hold_deletes


@pytest.fixture
async def disc(tmp_path: Path) -> AsyncIterator[Discovery]:
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as d:
        yield d


async def next_event(events: AsyncIterator[WatchEvent]) -> WatchEvent:
    return await asyncio.wait_for(events.__anext__(), 10)


async def test_settling_holds_deletions_until_rewritten_or_the_deadline(disc: Discovery) -> None:
    for key in ("p/held", "p/back"):
        await disc.register(key, b"1")
    events = hold_deletes(disc.watch("p/"), settling=lambda: True, hold_for=1.0)
    assert {(await next_event(events)).key for _ in range(2)} == {"p/held", "p/back"}

    await disc.unregister("p/held")  # held: no owner writes it again
    await disc.unregister("p/back")
    await disc.register("p/back", b"2")  # written again while held: only the PUT shows
    await disc.register("p/new", b"3")
    assert await next_event(events) == WatchEvent(EventKind.PUT, "p/back", b"2")
    assert await next_event(events) == WatchEvent(EventKind.PUT, "p/new", b"3")
    assert await next_event(events) == WatchEvent(EventKind.DELETE, "p/held")  # deadline
    await events.aclose()


async def test_a_dead_key_is_released_by_its_check_and_nothing_is_held_when_settled(
    disc: Discovery,
) -> None:
    settling = True
    await disc.register("p/dead", b"1")
    await disc.register("p/gone", b"1")

    async def alive(key: str) -> bool:
        return key != "p/dead"

    events = hold_deletes(disc.watch("p/"), lambda: settling, hold_for=600, alive=alive)
    assert {(await next_event(events)).key for _ in range(2)} == {"p/dead", "p/gone"}
    await disc.unregister("p/dead")  # held far past the test, but its check says dead
    assert await next_event(events) == WatchEvent(EventKind.DELETE, "p/dead")
    settling = False
    await disc.unregister("p/gone")  # settled: a deletion is believed at once
    assert await next_event(events) == WatchEvent(EventKind.DELETE, "p/gone")
    await events.aclose()


async def test_address_answers_tells_a_listening_port_from_a_closed_one() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    assert await address_answers(f"tcp://127.0.0.1:{port}")
    server.close()
    await server.wait_closed()
    assert not await address_answers(f"tcp://127.0.0.1:{port}")
    assert await address_answers("ipc:///tmp/somewhere")  # nothing to check: the deadline decides
