"""BookingSync in one process: replicas converge on one booked load (live events, a late
joiner's snapshot, a worker met late), forget a replica that leaves, expire bookings
nobody released, and publish an interval's changes as one message."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from unittest.mock import ANY

import pytest

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.router import KvRouter
from dynamoctl.router.standalone.bookings import BookingSync, mirror_key
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.ids import packed
from dynamoctl.wire.router import (
    Booked,
    BookingChanges,
    BookingState,
    Released,
    RouteNotify,
    RouteRequest,
)

NS = "bk"
MODEL = "m"
WORKERS = ("a", "b", "c")
PROMPT = list(range(1, 19))  # 4 full blocks of 4 + 2 tokens

pytestmark = pytest.mark.timeout(60)


def new_router(workers: tuple[str, ...] = WORKERS) -> KvRouter:
    router = KvRouter("kv", 4, seed=0)
    for w in workers:
        router.add_worker(w)
    return router


class Replica:
    def __init__(self, disc: Discovery, name: str, **kwargs: float) -> None:
        self.router = new_router()
        self.prefill = new_router(("p1", "p2"))  # the model's prefill pool

        def lookup(model: str, pool: wire_router.BookingPool) -> KvRouter | None:
            if model != MODEL:
                return None
            return self.prefill if pool == "prefill" else self.router

        self.sync = BookingSync(
            disc, NS, name, lookup, idle_poll=0.2, **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip

    def pick(self, rid: str, prompt: list[int] = PROMPT) -> str:
        worker = self.router.pick(prompt, rid).worker_id
        self.sync.booked(MODEL, rid)
        return worker

    def view(self) -> tuple[list[int], list[int], int]:
        prefill, blocks = self.router.load.loads(list(WORKERS))
        return prefill, blocks, len(self.router.load)


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Callable[..., Replica]]:
    made: list[Replica] = []
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as disc:

        async def make(name: str, **kwargs: float) -> Replica:
            replica = Replica(disc, name, **kwargs)
            await replica.sync.start()
            await replica.sync.register()
            made.append(replica)
            return replica

        try:
            yield make
        finally:
            for replica in made:
                await replica.sync.close()


async def converge(*replicas: Replica, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len({str(r.view()) for r in replicas}) > 1:
        assert time.monotonic() < deadline, [r.view() for r in replicas]
        await asyncio.sleep(0.02)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_replicas_converge_and_spread_a_burst(replicas: Callable[..., Replica]) -> None:
    one, two = await replicas("one"), await replicas("two")
    await until(lambda: one.sync.peers() == ["two"] and two.sync.peers() == ["one"])
    await until(lambda: one.sync.synced() and two.sync.synced(), timeout=2)  # no bookings yet
    first = one.pick("r1")
    await converge(one, two)
    assert two.view()[2] == 1 and two.router.load.prefill_tokens(first) == len(PROMPT)
    # The same prompt on the other replica: it sees the first booking and spreads.
    assert two.pick("r2") != first
    await converge(one, two)
    one.sync.released(MODEL, "r1", "first_token")
    await converge(one, two)
    assert two.router.load.prefill_tokens(first) == 0
    one.sync.released(MODEL, "r1", "finished")
    two.sync.released(MODEL, "r2", "finished")
    await converge(one, two)
    assert one.view() == ([0, 0, 0], [0, 0, 0], 0)


async def test_prefill_pool_bookings_reach_the_peers_prefill_router(
    replicas: Callable[..., Replica],
) -> None:
    one, two = await replicas("one"), await replicas("two")
    await until(lambda: two.sync.peers() == ["one"] and two.sync.synced())
    worker = one.prefill.pick(PROMPT, "r-p0").worker_id
    one.sync.booked(MODEL, "r-p0", "prefill")
    await until(lambda: len(two.prefill.load) == 1)
    assert two.prefill.load.prefill_tokens(worker) == len(PROMPT)
    assert len(two.router.load) == 0  # the decode pool is untouched
    # A release of the default pool under that id is not the prefill booking's.
    one.sync.released(MODEL, "r-p0", "finished")
    one.sync.released(MODEL, "r-p0", "finished", "prefill")
    await until(lambda: len(two.prefill.load) == 0)
    assert len(one.prefill.load) == 0 and one.sync.own_bookings(MODEL) == 0


async def test_late_joiner_gets_a_snapshot_and_a_leaver_is_forgotten(
    replicas: Callable[..., Replica],
) -> None:
    # Each change a message (no interval), so that a late subscriber needs the snapshot.
    one = await replicas("one", buffer_size=2, flush_interval=0)
    for i in range(6):
        one.pick(f"r{i}", [i, *PROMPT])
    one.sync.released(MODEL, "r0", "finished")
    late = await replicas("late")
    await converge(one, late)
    assert late.view()[2] == 5 and late.sync.pending() == 0
    await one.sync.discovery.unregister(one.sync.key)  # one stops
    await until(lambda: late.view() == ([0, 0, 0], [0, 0, 0], 0))


async def test_a_booking_on_a_worker_not_known_yet_waits_for_it(
    replicas: Callable[..., Replica],
) -> None:
    one, two = await replicas("one"), await replicas("two")
    two.router.remove_worker("c")  # two has not seen worker c yet
    await until(lambda: two.sync.peers() == ["one"] and two.sync.synced())
    assert one.router.pick(PROMPT, "r", exclude={"a", "b"}).worker_id == "c"
    one.sync.booked(MODEL, "r")
    await until(lambda: two.sync.pending() == 1)
    two.router.add_worker("c")
    await converge(one, two)
    two.router.remove_worker("c")  # c restarted: our load forgot what was booked on it
    two.router.add_worker("c")
    await converge(one, two)
    assert two.view()[2] == 1 and two.sync.pending() == 0


async def test_unreleased_bookings_expire(replicas: Callable[..., Replica]) -> None:
    one, two = await replicas("one", ttl=0.4), await replicas("two")
    await until(lambda: two.sync.peers() == ["one"])
    one.pick("lost")  # its frontend died: no release will ever come
    await converge(one, two)
    assert one.view()[2] == 1
    await until(lambda: one.view()[2] == 0 and two.view()[2] == 0)
    assert one.sync.expired == 1


async def test_changes_of_an_interval_are_one_message(replicas: Callable[..., Replica]) -> None:
    one, two = await replicas("one", flush_interval=0.3), await replicas("two")
    await until(lambda: two.sync.peers() == ["one"] and two.sync.synced())
    published = one.sync.publisher.next_seq
    workers = [one.pick(f"r{i}", [i, *PROMPT]) for i in range(5)]
    one.sync.released(MODEL, "r0", "first_token")  # folds into r0's booking
    one.sync.released(MODEL, "r1", "finished")  # booked and finished: never published
    await until(lambda: len(two.router.load) == 4)
    assert one.sync.publisher.next_seq == published + 1
    r0 = two.router.load.booking(mirror_key("one", "r0"))
    assert r0 is not None and r0.worker_id == workers[0] and r0.prefill_tokens == 0
    # Released later, in a message of their own interval.
    for i in (0, 2, 3, 4):
        one.sync.released(MODEL, f"r{i}", "finished")
    await converge(one, two)
    assert two.view() == ([0, 0, 0], [0, 0, 0], 0)
    assert one.sync.publisher.next_seq == published + 2


async def test_a_booking_in_a_snapshot_is_released_there(
    replicas: Callable[..., Replica],
) -> None:
    """A snapshot taken before the interval's message holds the booking already: its
    release must be published, though the booking itself never was."""
    one = await replicas("one", flush_interval=60)
    worker = one.pick("r")
    seq, state = one.sync._snapshot()
    assert wire_router.decode_booking(state) == BookingState(
        [Booked(MODEL, "r", worker, len(PROMPT), ANY)]
    )
    one.sync.released(MODEL, "r", "finished")
    one.sync._flush()
    assert one.sync.publisher.next_seq == seq + 2  # the release, after the snapshot


def test_wire_round_trips() -> None:
    messages = [
        RouteRequest(MODEL, "r", packed([1, 2, 3]), ["w"]),
        RouteRequest(MODEL, "r", packed([1, 2, 3]), [], "decode"),
        RouteNotify([wire_router.RouteEvent(MODEL, "r", "finished", "prefill")]),
        Booked(MODEL, "r", "w", 7, [2**64 - 1, 0]),
        Booked(MODEL, "r", "w", 7, [1], "prefill"),
        Released(MODEL, "r", "first_token"),
        Released(MODEL, "r", "finished", "prefill"),
        BookingState([Booked(MODEL, "r", "w", 0, [])]),
        BookingChanges([Booked(MODEL, "r", "w", 7, [1]), Released(MODEL, "q", "finished")]),
    ]
    for message in messages:
        decode = (
            wire_router.decode_call
            if isinstance(message, RouteRequest | RouteNotify)
            else wire_router.decode_booking
        )
        assert decode(wire_router.encode(message)) == message
    # Older peers: a reply without the disaggregation fields decodes with their defaults,
    # and a new RouteRequest without a pool encodes as an old one did.
    old = wire_router.encode(wire_router.RouteReply("w", "tcp://x", 1, 2))
    reply = wire_router.decode_answer(old)
    assert isinstance(reply, wire_router.RouteReply) and not reply.disaggregated
    assert wire_router.encode(RouteRequest(MODEL, "r", [1])) == wire_router.encode(
        RouteRequest(MODEL, "r", [1], [], "default")
    )
    reply = wire_router.RouteReply("w", "tcp://h:1", 3, 4)
    assert wire_router.decode_answer(wire_router.encode(reply)) == reply
