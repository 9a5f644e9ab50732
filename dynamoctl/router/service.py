"""Feeds a :class:`KvRouter` from discovery and the workers' event streams.

* Membership: watches ``{ns}/instances/worker/`` (:class:`InstanceRecord`) and
  ``{ns}/events/worker/`` (:class:`EventsRecord`). An instance serving ``model`` on the
  ``generate`` endpoint is added when its record appears and removed when it goes (drain
  or lease expiry). While discovery settles after an outage, a worker whose records
  vanished stays routable until it registers again, its request-plane port stops
  accepting connections, or about a lease TTL passes (stale-while-unavailable,
  :mod:`dynamoctl.discovery.hold`). A record that comes back with another address or
  pid under the same id is a new life: removed and added again, so nothing of the old one
  survives.
* Streams: one :class:`EventSubscriber` for KV events (only when the mode uses them) and
  one for load metrics; each worker is subscribed once both its records are known.

What each KV stream item does to the worker's index:

========================  =============================================================
``Event``                 applied
``Snapshot``              reset, then applied (the worker's whole cache)
``Lost`` (any reason)     reset; then, unless the stream can rebuild on its own, a
                          **resync**: the publisher is dropped and subscribed afresh,
                          which replays from seq 0, or answers with a snapshot when its
                          buffer no longer reaches 0. The stream rebuilds on its own
                          after a restart whose new life replays from 0 (empty range).
========================  =============================================================

A resync is skipped when the Lost is the first item of a subscription (a publisher
without snapshots whose buffer no longer reaches 0: another resync would meet the same
gap) and happens at most once per ``resync_interval`` per worker. The index then holds
only what later events can attach to (see :mod:`dynamoctl.router.index`). Items of a
previous subscription still queued are dropped: publisher ids carry a generation.

A new service over live workers (a restarted router) subscribes late, which the event
plane answers with a replay from 0 or a snapshot: it rebuilds the same index the old
one had, not an empty one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TypeAlias

import msgspec

from dynamoctl.discovery import Discovery, EventKind, WatchEvent, keys
from dynamoctl.discovery.hold import address_answers
from dynamoctl.planes.events import Event, EventSubscriber, Item, Lost, Snapshot
from dynamoctl.router.router import KvRouter
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire.engine import decode_load
from dynamoctl.wire.kv_events import decode_batch
from dynamoctl.wire.records import Endpoint, EventsRecord, InstanceRecord, decode_json

log = logging.getLogger(__name__)


@dataclass
class _Streams:
    """One worker's subscriptions."""

    record: EventsRecord
    kv_gen: int
    load_gen: int
    kv_delivered: bool = False  # an item of the current KV subscription was consumed
    last_resync: float = float("-inf")


_Handler: TypeAlias = Callable[[WatchEvent], Awaitable[None]]
_ItemHandler: TypeAlias = Callable[[str, int, _Streams, Item], Awaitable[None]]


class RouterService(AsyncService):
    """Keeps ``router`` in step with the workers of ``model`` in ``namespace``."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        model: str,
        router: KvRouter,
        *,
        component: str = "worker",
        endpoint: str = Endpoint.GENERATE,
        roles: Collection[str] | None = None,
        idle_poll: float = 1.0,
        resync_interval: float = 5.0,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.model = model
        """Only instances whose record names this model are routed to."""
        self.router = router
        self.component = component
        """Discovery component of the workers (``worker``)."""
        self.endpoint = endpoint
        """Request-plane endpoint the picked worker is called on."""
        self.roles = None if roles is None else frozenset(roles)
        """Worker roles to route to (``agg``, ``prefill``, ``decode``); None: any."""
        self.resync_interval = resync_interval
        """Least seconds between two resyncs of one worker's KV stream."""
        self._kv = EventSubscriber(idle_poll=idle_poll)
        self._load = EventSubscriber(idle_poll=idle_poll)
        self._instances: dict[str, InstanceRecord] = {}
        self._labels: dict[str, str] = {}
        """Supervisor names of the workers seen (kept after they leave, for the log)."""
        self.generation = 0
        """Bumped on every change to the routable workers: a key for views derived from
        them (the frontend caches whether a model is disaggregated)."""
        self._events: dict[str, EventsRecord] = {}
        self._streams: dict[str, _Streams] = {}
        self._gen = itertools.count()
        self._lock = asyncio.Lock()  # serialises subscription changes
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        ns, comp = self.namespace, self.component
        jobs = {
            "instances": self._watch(keys.instances_prefix(ns, comp), self._on_instance),
            "events": self._watch(keys.events_prefix(ns, comp), self._on_events),
            "kv": self._consume(self._kv, self._on_kv),
            "load": self._consume(self._load, self._on_load),
        }
        for name, job in jobs.items():
            task = asyncio.create_task(job, name=f"router-{name}")
            task.add_done_callback(_log_crash)
            self._tasks.append(task)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._kv.close()
        await self._load.close()

    def ready(self) -> bool:
        """Whether at least one worker is routable."""
        return bool(self.router.workers())

    async def wait_for_workers(self, n: int = 1, timeout: float = 30.0) -> None:
        """Wait until at least ``n`` workers are routable; ``TimeoutError`` after
        ``timeout`` seconds, naming how many there are."""
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: len(self.router.workers()) >= n), timeout
                )
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"{len(self.router.workers())} of {n} worker(s) of {self.model!r} in "
                f"{self.namespace!r} after {timeout:.1f}s"
            ) from None

    def instance(self, worker_id: str) -> InstanceRecord | None:
        """The record of a routable worker (its ``address`` is where to send)."""
        return self._instances.get(worker_id) if worker_id in self.router else None

    def name_of(self, iid: str) -> str:
        """A worker as logs name it: its ``status`` name (``agg-1``) with its instance id."""
        label = self._labels.get(iid)
        return f"{label} ({iid})" if label else iid

    # ------------------------------------------------------------------ discovery

    async def _watch(self, prefix: str, handle: _Handler) -> None:
        async for event in self.discovery.watch(prefix, hold=True, alive=self._answers):
            try:
                await handle(event)
            except (ValueError, msgspec.DecodeError) as exc:  # a foreign or newer record
                log.warning("router %s: ignoring %s: %s", self.model, event.key, exc)

    async def _answers(self, key: str) -> bool:
        """Whether the worker of a held key still accepts request-plane connections."""
        record = self._instances.get(key.rpartition("/")[2])  # the instance id is last
        return record is not None and await address_answers(record.address)

    async def _on_instance(self, event: WatchEvent) -> None:
        _, _, endpoint, iid = keys.split_instance_key(event.key)
        if endpoint != self.endpoint:
            return
        record = None
        if event.kind is EventKind.PUT:
            assert event.value is not None
            record = decode_json(event.value, InstanceRecord)  # before any change of state
            serves = record.model == self.model or self.model in record.adapters
            if not serves or (self.roles is not None and record.role not in self.roles):
                record = None
        old = self._instances.pop(iid, None)
        if record is not None:
            if old is not None and (old.address, old.pid) != (record.address, record.pid):
                log.info("router %s: worker %s restarted", self.model, self.name_of(iid))
                await self._reconcile(iid)  # removes the old life
            self._instances[iid] = record
            self._labels[iid] = record.label
        await self._reconcile(iid)

    async def _on_events(self, event: WatchEvent) -> None:
        iid = event.key.rpartition("/")[2]
        if event.kind is EventKind.PUT:
            assert event.value is not None
            self._events[iid] = decode_json(event.value, EventsRecord)
        else:
            self._events.pop(iid, None)
        await self._reconcile(iid)

    async def _reconcile(self, iid: str) -> None:
        """Bring the router and the subscriptions in line with the records of ``iid``."""
        self.generation += 1
        router = self.router
        async with self._lock:
            if iid not in self._instances:
                if iid in router:
                    router.remove_worker(iid)
                    log.info("router %s: worker %s removed", self.model, self.name_of(iid))
                await self._unsubscribe(iid)
            else:
                if iid not in router:
                    router.add_worker(iid)
                    log.info("router %s: worker %s added", self.model, self.name_of(iid))
                events, streams = self._events.get(iid), self._streams.get(iid)
                if streams is not None and streams.record != events:
                    await self._unsubscribe(iid)
                    router.reset_worker_kv(iid)
                    streams = None
                if streams is None and events is not None:
                    await self._subscribe(iid, events)
        async with self._changed:
            self._changed.notify_all()

    async def _subscribe(self, iid: str, record: EventsRecord) -> None:
        streams = self._streams[iid] = _Streams(record, next(self._gen), next(self._gen))
        self.router.set_silent_tiers(iid, record.silent_tiers)
        if self.router.wants_kv_events:
            await self._kv.add_publisher(
                f"{iid}#{streams.kv_gen}", record.kv, record.kv_replay, curve=record.kv_curve
            )
        await self._load.add_publisher(f"{iid}#{streams.load_gen}", record.load, record.load_replay)

    async def _unsubscribe(self, iid: str) -> None:
        streams = self._streams.pop(iid, None)
        if streams is not None:
            await self._kv.remove_publisher(f"{iid}#{streams.kv_gen}")
            await self._load.remove_publisher(f"{iid}#{streams.load_gen}")

    async def _resync(self, iid: str, streams: _Streams) -> None:
        """Subscribe to the KV stream afresh: a replay from 0 or a snapshot rebuilds it."""
        async with self._lock:
            if self._streams.get(iid) is not streams:
                return  # unsubscribed or replaced meanwhile
            await self._kv.remove_publisher(f"{iid}#{streams.kv_gen}")
            self.router.reset_worker_kv(iid)
            streams.kv_gen, streams.kv_delivered = next(self._gen), False
            streams.last_resync = time.monotonic()
            record = streams.record
            await self._kv.add_publisher(
                f"{iid}#{streams.kv_gen}", record.kv, record.kv_replay, curve=record.kv_curve
            )

    # ------------------------------------------------------------------ streams

    async def _consume(self, subscriber: EventSubscriber, handle: _ItemHandler) -> None:
        async for item in subscriber:
            iid, _, gen = item.publisher_id.rpartition("#")
            streams = self._streams.get(iid)
            if streams is None:
                continue  # unsubscribed meanwhile
            try:
                await handle(iid, int(gen), streams, item)
            except Exception:  # a bad payload must not stop the streams of every worker
                log.exception(
                    "router %s: bad %s from worker %s", self.model, type(item).__name__, iid
                )
                if subscriber is self._kv:  # the index may now miss events: never guess
                    self.router.reset_worker_kv(iid)

    async def _on_kv(self, iid: str, gen: int, streams: _Streams, item: Item) -> None:
        if gen != streams.kv_gen:
            return  # from a subscription replaced by a resync
        first, streams.kv_delivered = not streams.kv_delivered, True
        if isinstance(item, Event):
            self.router.apply_kv_batch(iid, decode_batch(item.payload))
        elif isinstance(item, Snapshot):
            self.router.reset_worker_kv(iid)
            self.router.apply_kv_batch(iid, decode_batch(item.payload))
        else:
            self.router.reset_worker_kv(iid)
            if _rebuilds(item) or first:
                return
            if time.monotonic() - streams.last_resync < self.resync_interval:
                log.warning(
                    "router %s: worker %s lost KV events again", self.model, self.name_of(iid)
                )
                return
            log.info("router %s: resyncing KV events of worker %s", self.model, self.name_of(iid))
            await self._resync(iid, streams)

    async def _on_load(self, iid: str, gen: int, streams: _Streams, item: Item) -> None:
        # A lost load update needs nothing: the next one replaces it.
        if gen == streams.load_gen and isinstance(item, Event | Snapshot):
            self.router.update_load(iid, decode_load(item.payload))


def _rebuilds(lost: Lost) -> bool:
    """A restart whose new life is replayed from seq 0: the events that follow rebuild
    the whole state."""
    return lost.reason == "restart" and lost.last_missing < lost.first_missing


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s crashed", task.get_name(), exc_info=task.exception())
