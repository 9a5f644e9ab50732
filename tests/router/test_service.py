"""RouterService against in-process publishers and embedded discovery: membership, late
join by snapshot, restarts under one id, and what each stream item does to the index."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.planes.events import Event, EventPublisher, Lost, Snapshot
from dynamoctl.router import KvRouter, RouterService
from dynamoctl.router.service import _Streams
from dynamoctl.wire.engine import LoadMetrics
from dynamoctl.wire.kv_events import BlockStored, KVEventBatch, encode_batch
from dynamoctl.worker.kv_state import KvCacheState

NS = "svc"
MODEL = "m"
B = 4


class FakeWorker:
    """A worker's registrations and streams, without an engine."""

    def __init__(
        self, disc: Discovery, iid: str, model: str = MODEL, buffer: int = 4, label: str = ""
    ) -> None:
        self.disc, self.iid, self.model, self.label = disc, iid, model, label
        self.state = KvCacheState()
        self.kv = EventPublisher(
            "tcp://127.0.0.1:0",
            "tcp://127.0.0.1:0",
            buffer_size=buffer,  # small: a late subscriber needs the snapshot
            snapshot=lambda: (self.kv.next_seq - 1, encode_batch(self.state.snapshot())),
        )
        self.load = EventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        self.tokens: list[int] = []

    async def start(self, pid: int = 1) -> FakeWorker:
        await self.kv.start()
        await self.load.start()
        events = wire.EventsRecord(
            kv=self.kv.address,
            kv_replay=self.kv.replay_address,
            kv_topic="kv-events",
            load=self.load.address,
            load_replay=self.load.replay_address,
            load_topic="load",
        )
        await self.disc.register(keys.events_key(NS, "worker", self.iid), wire.encode_json(events))
        await self.register(pid)
        return self

    async def register(self, pid: int) -> None:
        record = wire.InstanceRecord(
            instance_id=self.iid,
            component="worker",
            endpoint="generate",
            address=f"tcp://127.0.0.1:{1000 + pid}",
            host="h",
            pid=pid,
            model=self.model,
            label=self.label,
        )
        await self.disc.register(self.key, wire.encode_json(record))

    @property
    def key(self) -> str:
        return keys.instance_key(NS, "worker", "generate", self.iid)

    def grow(self, blocks: int) -> None:
        """Cache ``blocks`` more blocks continuing this worker's one sequence."""
        parent = sequence_hashes(self.tokens, B)[-1] if self.tokens else None
        new = [len(self.tokens) + i + 1 for i in range(blocks * B)]
        hashes = sequence_hashes(new, B, parent)
        batch = KVEventBatch(time.time(), [BlockStored(hashes, parent, new, B)])
        self.tokens += new
        self.state.apply(batch)
        self.kv.publish(encode_batch(batch))

    async def close(self) -> None:
        await self.kv.close()
        await self.load.close()


def load_metrics(waiting: int) -> LoadMetrics:
    return LoadMetrics(
        active_blocks=0,
        total_blocks=10,
        num_waiting=waiting,
        num_running=0,
        prefill_tokens_queued=0,
        kv_usage=0.0,
    )


@pytest.fixture
async def disc(tmp_path: Path) -> AsyncIterator[Discovery]:
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as d:
        yield d


async def until(what: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_membership_snapshot_join_and_restart_under_one_id(disc: Discovery) -> None:
    w1 = await FakeWorker(disc, "w1").start()
    w2 = await FakeWorker(disc, "w2").start()
    other = await FakeWorker(disc, "x", model="another").start()
    for _ in range(10):
        w1.grow(2)  # 10 batches, 4 kept for replay: a late join needs the snapshot
    service = RouterService(disc, NS, MODEL, KvRouter("kv", B), idle_poll=0.2)
    try:
        await service.start()
        await service.wait_for_workers(2, timeout=10)
        assert sorted(service.router.workers()) == ["w1", "w2"] and service.ready()
        record = service.instance("w1")
        assert record is not None and record.address == "tcp://127.0.0.1:1001"
        await until(lambda: service.router.find_matches(w1.tokens) == {"w1": 20})
        kv_stream = f"w1#{service._streams['w1'].kv_gen}"  # white box: the path under test
        assert service._kv.stats(kv_stream).snapshots == 1

        w1.grow(1)  # live events keep applying after the snapshot
        await until(lambda: service.router.find_matches(w1.tokens) == {"w1": 21})
        w1.load.publish(wire.engine.encode(load_metrics(waiting=3)))
        await until(lambda: (m := service.router.metrics("w1")) is not None and m.num_waiting == 3)

        await disc.unregister(w2.key)  # drained or expired
        await until(lambda: service.router.workers() == ["w1"])

        # Same id, new pid: a new life. Its old bookings and index go; the fresh
        # subscription rebuilds the index from the (still live) publisher.
        service.router.pick(w1.tokens, "r1")
        await w1.register(pid=2)
        await until(lambda: service.router.load.booking("r1") is None)
        await until(lambda: service.router.find_matches(w1.tokens) == {"w1": 21})
        record = service.instance("w1")
        assert record is not None and record.pid == 2

        with pytest.raises(TimeoutError, match="1 of 3 worker"):
            await service.wait_for_workers(3, timeout=0.2)
    finally:
        await service.close()
        for w in (w1, w2, other):
            await w.close()


async def test_logs_name_workers_as_status_does(
    disc: Discovery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynamoctl.router.service")
    worker = await FakeWorker(disc, "vm-7-0", label="agg-1").start()
    service = RouterService(disc, NS, MODEL, KvRouter("kv", B), idle_poll=0.2)
    try:
        await service.start()
        await service.wait_for_workers(1, timeout=10)
        await disc.unregister(worker.key)
        await until(lambda: service.router.workers() == [])
    finally:
        await service.close()
        await worker.close()
    assert f"router {MODEL}: worker agg-1 (vm-7-0) added" in caplog.text
    assert f"router {MODEL}: worker agg-1 (vm-7-0) removed" in caplog.text


async def test_round_robin_mode_does_not_subscribe_to_kv_events(disc: Discovery) -> None:
    w1 = await FakeWorker(disc, "w1").start()
    w1.grow(2)
    service = RouterService(disc, NS, MODEL, KvRouter("round-robin", B), idle_poll=0.2)
    async with service:
        await service.wait_for_workers(1, timeout=10)
        w1.load.publish(wire.engine.encode(load_metrics(waiting=1)))
        await until(lambda: service.router.metrics("w1") is not None)
        assert service.router.find_matches(w1.tokens) == {}
    await w1.close()


# ----------------------------------------------------------------------- stream items


class Driven:
    """A service whose KV items are fed by hand (no sockets), recording resyncs."""

    def __init__(self, disc: Discovery) -> None:
        self.service = RouterService(disc, NS, MODEL, KvRouter("kv", B))
        self.router = self.service.router
        self.router.add_worker("w")
        record = wire.EventsRecord(
            kv="k", kv_replay="kr", kv_topic="", load="l", load_replay=None, load_topic=""
        )
        self.streams = self.service._streams["w"] = _Streams(record, kv_gen=0, load_gen=1)
        self.resyncs = 0

        async def resync(iid: str, streams: _Streams) -> None:
            self.resyncs += 1
            streams.kv_gen, streams.kv_delivered = streams.kv_gen + 10, False
            streams.last_resync = time.monotonic()

        self.service._resync = resync  # type: ignore[method-assign]

    async def feed(self, item: Event | Snapshot | Lost, gen: int | None = None) -> None:
        gen = self.streams.kv_gen if gen is None else gen
        await self.service._on_kv("w", gen, self.streams, item)


def stored(tokens: list[int]) -> bytes:
    hashes = sequence_hashes(tokens, B)
    return encode_batch(KVEventBatch(0.0, [BlockStored(hashes, None, tokens, B)]))


PROMPT = list(range(1, 13))  # 3 blocks


async def test_items_apply_reset_and_resync(disc: Discovery) -> None:
    d = Driven(disc)
    await d.feed(Event("w#0", 0, stored(PROMPT)))
    assert d.router.find_matches(PROMPT) == {"w": 3}

    await d.feed(Snapshot("w#0", 5, stored(PROMPT[:4])))  # replaces, not adds
    assert d.router.find_matches(PROMPT) == {"w": 1}

    await d.feed(Lost("w#0", 6, 9, "gap"))  # mid-stream: reset, then resync
    assert d.router.find_matches(PROMPT) == {} and d.resyncs == 1

    await d.feed(Event("w#0", 10, stored(PROMPT)), gen=0)  # from the replaced subscription
    assert d.router.find_matches(PROMPT) == {}

    await d.feed(Lost("w#10", 0, 3, "gap"))  # first item of the new subscription: no loop
    assert d.resyncs == 1
    await d.feed(Event("w#10", 4, stored(PROMPT)))
    await d.feed(Lost("w#10", 5, 6, "unverified"))  # again, but within resync_interval
    assert d.resyncs == 1 and d.router.find_matches(PROMPT) == {}

    d.streams.last_resync = 0.0
    await d.feed(Event("w#10", 7, stored(PROMPT)))
    await d.feed(Lost("w#10", 0, -1, "restart"))  # new life replayed from 0: rebuilds itself
    assert d.resyncs == 1 and d.router.find_matches(PROMPT) == {}
    await d.feed(Event("w#10", 0, stored(PROMPT)))
    assert d.router.find_matches(PROMPT) == {"w": 3}
    await d.feed(Lost("w#10", 0, 4, "restart"))  # restart whose start is gone: resync
    assert d.resyncs == 2
