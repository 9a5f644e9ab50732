"""Event plane over real sockets: a dict mutated by published set/delete ops must end up
identical on the subscriber side, or the subscriber must have been told it is not."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.planes.events import (
    Event,
    EventPublisher,
    EventSubscriber,
    Item,
    Lost,
    Snapshot,
)

BURST = 5000


class Source:
    """The publisher side: a dict changed only through published ops."""

    def __init__(self, *, buffer_size: int, with_snapshot: bool, seed: int = 0, **kw: Any):
        self.state: dict[int, int] = {}
        self.rng = random.Random(seed)
        snapshot = self.snapshot if with_snapshot else None
        self.pub = EventPublisher(buffer_size=buffer_size, snapshot=snapshot, **kw)

    def snapshot(self) -> tuple[int, bytes]:
        return self.pub.next_seq - 1, msgspec.msgpack.encode(self.state)

    def op(self) -> None:
        key = self.rng.randrange(64)
        if self.rng.random() < 0.3:
            self.state.pop(key, None)
            self.pub.publish(msgspec.msgpack.encode(["del", key]))
        else:
            value = self.rng.randrange(1 << 30)
            self.state[key] = value
            self.pub.publish(msgspec.msgpack.encode(["set", key, value]))

    def burst(self, n: int = BURST) -> None:
        for _ in range(n):  # no await: the subscriber cannot keep up, its HWM overflows
            self.op()


class Mirror:
    """The consumer side for one publisher."""

    def __init__(self) -> None:
        self.state: dict[int, int] = {}
        self.last_seq = -1
        self.items: list[Item] = []

    @property
    def lost(self) -> list[Lost]:
        return [i for i in self.items if isinstance(i, Lost)]

    def apply(self, item: Item) -> None:
        self.items.append(item)
        if isinstance(item, Event):
            assert item.seq > self.last_seq
            op = msgspec.msgpack.decode(item.payload)
            if op[0] == "del":
                self.state.pop(op[1], None)
            else:
                self.state[op[1]] = op[2]
            self.last_seq = item.seq
        elif isinstance(item, Snapshot):
            decoded = msgspec.msgpack.decode(item.payload, type=dict[int, int])
            self.state = decoded
            self.last_seq = item.seq
        else:
            self.state.clear()  # what a KV router does: forget that worker's blocks
            self.last_seq = item.last_missing


async def follow(
    sub: EventSubscriber, mirror: Mirror, done: Callable[[], bool], seconds: float = 20
) -> None:
    async def run() -> None:
        while not done():
            mirror.apply(await sub.get())

    await asyncio.wait_for(run(), seconds)


async def publish_until_seen(sub: EventSubscriber, source: Source, mirror: Mirror) -> None:
    """Publish one op at a time until the subscriber has caught up with a live one."""
    for _ in range(200):
        received = sub.stats("w").received_live
        source.op()
        try:
            await follow(sub, mirror, caught_up(source, mirror), 0.05)
        except asyncio.TimeoutError:
            continue
        if sub.stats("w").received_live > received:
            return
    raise AssertionError("the subscriber never received a live event")


async def join(sub: EventSubscriber, source: Source, mirror: Mirror) -> None:
    """Subscribe and wait for a live event, so that the burst that follows is lost
    mid-stream rather than before the connection exists."""
    await sub.add_publisher("w", source.pub.address, source.pub.replay_address)
    await publish_until_seen(sub, source, mirror)


def caught_up(source: Source, mirror: Mirror) -> Callable[[], bool]:
    return lambda: mirror.last_seq == source.pub.next_seq - 1


@pytest.fixture
async def lossy_sub() -> AsyncIterator[EventSubscriber]:
    # HWM 1 and a one-item queue: almost every message of a burst is dropped by ZeroMQ.
    async with EventSubscriber(idle_poll=0.2, replay_timeout=0.5, rcvhwm=1, queue_size=1) as s:
        yield s


@pytest.mark.parametrize(
    ("buffer_size", "with_snapshot"),
    [(2 * BURST, False), (8, True)],
    ids=["recovered-by-replay", "recovered-by-snapshot"],
)
async def test_a_lossy_subscriber_ends_with_the_exact_state(
    lossy_sub: EventSubscriber, buffer_size: int, with_snapshot: bool
) -> None:
    source, mirror = (
        Source(buffer_size=buffer_size, with_snapshot=with_snapshot, sndhwm=1),
        Mirror(),
    )
    async with source.pub:
        await join(lossy_sub, source, mirror)
        source.burst()
        await follow(lossy_sub, mirror, caught_up(source, mirror))
        # Trailing messages lost after the last one seen are recovered by the idle poll.
        source.burst(50)
        await follow(lossy_sub, mirror, caught_up(source, mirror))
        assert mirror.state == source.state
        assert mirror.lost == []
        stats = lossy_sub.stats("w")
        assert stats.received_live < source.pub.next_seq  # ZeroMQ did drop messages
        if with_snapshot:
            assert stats.snapshots >= 1
        else:
            assert stats.received_replay > BURST // 2


@pytest.mark.parametrize("with_snapshot", [False, True], ids=["replay", "snapshot"])
async def test_a_late_joiner_ends_with_the_exact_state(with_snapshot: bool) -> None:
    buffer_size = 8 if with_snapshot else 2 * BURST
    source, mirror = Source(buffer_size=buffer_size, with_snapshot=with_snapshot), Mirror()
    async with source.pub, EventSubscriber(idle_poll=0.2) as sub:
        source.burst()
        await sub.add_publisher("w", source.pub.address, source.pub.replay_address)
        await follow(sub, mirror, caught_up(source, mirror))
        assert mirror.state == source.state
        assert mirror.lost == []


async def test_without_snapshot_an_outrun_buffer_is_reported_lost(
    lossy_sub: EventSubscriber,
) -> None:
    source, mirror = Source(buffer_size=4, with_snapshot=False, sndhwm=1), Mirror()
    async with source.pub:
        await join(lossy_sub, source, mirror)
        source.burst()
        await follow(lossy_sub, mirror, caught_up(source, mirror))
        assert mirror.lost, "messages were dropped and could not be replayed: Lost expected"
        assert lossy_sub.stats("w").lost == len(mirror.lost)


async def test_without_a_replay_socket_every_gap_is_reported_lost(
    lossy_sub: EventSubscriber,
) -> None:
    source = Source(buffer_size=4, with_snapshot=False, sndhwm=1, replay_address=None)
    mirror = Mirror()
    async with source.pub:
        await lossy_sub.add_publisher("w", source.pub.address)
        await publish_until_seen(lossy_sub, source, mirror)
        source.burst()
        # Nothing can bring back a dropped trailing message; publish until one gets through.
        await publish_until_seen(lossy_sub, source, mirror)
        assert mirror.lost
        assert all(lost.reason != "restart" for lost in mirror.lost)


async def test_a_replay_socket_that_never_answers_ends_in_lost_not_a_hang() -> None:
    source, mirror = Source(buffer_size=4, with_snapshot=False, sndhwm=1), Mirror()
    silent = zmq.asyncio.Context.instance().socket(zmq.ROUTER)  # takes requests, never answers
    silent.bind("tcp://127.0.0.1:*")
    silent_address = silent.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]
    sub = EventSubscriber(idle_poll=5, replay_timeout=0.1, replay_retries=2, rcvhwm=1, queue_size=1)
    try:
        async with source.pub, sub:
            await sub.add_publisher("w", source.pub.address, silent_address)
            await publish_until_seen(sub, source, mirror)
            source.burst()
            await publish_until_seen(sub, source, mirror)
            assert mirror.lost
            assert sub.stats("w").replay_timeouts >= 3  # first try + 2 retries
    finally:
        silent.close(linger=0)


@pytest.mark.parametrize("with_snapshot", [False, True], ids=["no-snapshot", "snapshot"])
@pytest.mark.parametrize("new_ops", [0, 10, 300], ids=["silent", "behind", "ahead"])
async def test_a_restarted_publisher_resets_the_subscriber(
    with_snapshot: bool, new_ops: int
) -> None:
    old = Source(buffer_size=1000, with_snapshot=with_snapshot, seed=1)
    mirror = Mirror()
    async with EventSubscriber(idle_poll=0.2, replay_timeout=0.3) as sub:
        await old.pub.start()
        await sub.add_publisher("w", old.pub.address, old.pub.replay_address)
        old.burst(200)
        await follow(sub, mirror, caught_up(old, mirror))
        await old.pub.close()

        # Same addresses, new life: seq starts again at 0 with a different state.
        new = Source(
            buffer_size=1000,
            with_snapshot=with_snapshot,
            seed=2,
            address=old.pub.address,
            replay_address=old.pub.replay_address,
        )
        async with new.pub:
            new.burst(new_ops)
            reset_at = len(mirror.items)

            def settled() -> bool:
                reset = any(isinstance(i, Lost | Snapshot) for i in mirror.items[reset_at:])
                return reset and mirror.last_seq == new.pub.next_seq - 1

            await follow(sub, mirror, settled)
            assert mirror.state == new.state


async def test_publisher_frames_are_vllm_compatible() -> None:
    """The exact frames a vLLM subscriber (SUB + REQ-style replay) sees from us."""
    ctx = zmq.asyncio.Context.instance()
    async with EventPublisher(topic=b"kv") as pub:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.address)
        replay = ctx.socket(zmq.DEALER)
        replay.connect(pub.replay_address or "")
        try:
            frames: list[bytes] = []
            for _ in range(200):  # slow joiner: publish until the SUB is connected
                pub.publish(b"payload")
                if await sub.poll(50):
                    frames = await sub.recv_multipart()
                    break
            assert frames[0] == b"kv" and frames[2] == b"payload"
            assert int.from_bytes(frames[1], "big") == pub.next_seq - 1

            await replay.send_multipart([b"", (pub.next_seq - 1).to_bytes(8, "big")])
            entry = await asyncio.wait_for(replay.recv_multipart(), 5)
            end = await asyncio.wait_for(replay.recv_multipart(), 5)
            assert entry == [b"", (pub.next_seq - 1).to_bytes(8, "big"), b"payload"]
            assert end == [b"", (-1).to_bytes(8, "big", signed=True), b""]
            assert end[1] == wire.END_SEQ
        finally:
            sub.close(linger=0)
            replay.close(linger=0)
