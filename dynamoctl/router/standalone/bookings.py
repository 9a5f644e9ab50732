"""Booked load shared between router replicas, so that they decide alike.

The KV side needs no help: every replica subscribes to every worker's KV events. What
one replica cannot see is the load the *others* booked (prefill tokens and blocks of
requests they routed), which the ``kv`` cost and busy detection use. So each replica
publishes its booking changes on an event-plane stream (``Booked``, ``Released``; a
``BookingState`` snapshot for late subscribers), registered at
``{ns}/events/router/{instance_id}``, and applies every other replica's stream to its own
:class:`~dynamoctl.router.load.ActiveLoad`, under the key ``{replica}/{request_id}``.
Frontend processes with embedded routers (``frontend.processes`` > 1, or frontends on
several hosts) share theirs the same way under ``{ns}/events/frontend/``.

A peer's booking on a worker (or of a model) we do not know yet waits, and is booked
once we do (a replica that starts replays its peers' streams before it has met every
worker). A peer's bookings are dropped when its record leaves discovery (stop, or lease
expiry after a crash) and replaced on a snapshot. Own bookings whose release never came (a
frontend killed mid-request) expire after ``ttl`` seconds, and the expiry is published.

Changes are published together every ``flush_interval`` (a :class:`BookingChanges`), net
of what happened in between: a request booked and finished within one interval is never
published, and its first token folds into its booking. One message per request per
interval rather than three (booked, first token, finished) is what keeps N processes'
CPU per request near one's: each message costs a PUB send, a wake-up of ZeroMQ's I/O
threads on both sides and a wake-up of every peer's subscriber (docs/operations.md,
"Several frontend processes"). Peers see a booking at most that much later.

A model has two routers (:mod:`dynamoctl.router.pools`): every message names the
``pool`` it books in, so a prefill worker's bookings land in every replica's prefill
router.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.planes.events import Event, EventPublisher, EventSubscriber, Item, Snapshot
from dynamoctl.router.load import Booking
from dynamoctl.router.router import KvRouter
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.records import BookingsRecord, Component, decode_json, encode_json
from dynamoctl.wire.router import (
    Booked,
    BookingChanges,
    BookingMessage,
    BookingPool,
    BookingState,
    Released,
    RouteEventKind,
)

log = logging.getLogger(__name__)

COMPONENT = Component.ROUTER
TOPIC = b"bookings"

RouterLookup = Callable[[str, BookingPool], "KvRouter | None"]
"""The router of a model's pool, if this replica follows the model."""
Key = tuple[str, BookingPool, str]
"""(model, pool, request id) of a booking."""


def mirror_key(replica: str, request_id: str) -> str:
    """Key of another replica's booking in our ActiveLoad (instance ids have no '/')."""
    return f"{replica}/{request_id}"


@dataclass
class _Peer:
    record: BookingsRecord
    gen: int
    bookings: dict[Key, Booked] = field(default_factory=dict)
    """What the peer holds now, as its stream says."""
    applied: set[Key] = field(default_factory=set)
    """Those of ``bookings`` that are in our load (the others wait for their worker)."""
    delivered: bool = False
    last_resync: float = float("-inf")


class BookingSync(AsyncService):
    """Publishes this replica's bookings and applies the other replicas'."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        instance_id: str,
        routers: RouterLookup,
        *,
        host: str = "127.0.0.1",
        ttl: float = 600.0,
        idle_poll: float = 1.0,
        resync_interval: float = 1.0,
        reapply_interval: float = 0.25,
        buffer_size: int = 1024,
        component: str = COMPONENT,
        flush_interval: float = 0.01,
    ) -> None:
        self.discovery = discovery
        self.component = component
        """Whose bookings streams these are (``router`` replicas or ``frontend``
        processes): peers are the instances of this component only."""
        self.namespace = namespace
        self.instance_id = instance_id
        self.routers = routers
        self.ttl = ttl
        """Seconds after which an own booking nobody released is released."""
        self.resync_interval = resync_interval
        self.reapply_interval = reapply_interval
        """Seconds between retries of peer bookings not in our load."""
        self.flush_interval = flush_interval
        """Seconds between publications of our changes (0: each at once)."""
        # A small buffer is enough: a subscriber that falls behind gets a snapshot.
        self.publisher = EventPublisher(
            f"tcp://{host}:0",
            f"tcp://{host}:0",
            topic=TOPIC,
            buffer_size=buffer_size,
            snapshot=self._snapshot,
        )
        self.expired = 0
        """Own bookings released by the TTL."""
        self._subscriber = EventSubscriber(idle_poll=idle_poll)
        self._own: dict[Key, float] = {}  # -> booked at
        self._unsent: dict[Key, Booked | Released] = {}
        """Each booking's net change since the last publication, in order of its first."""
        self._shown: set[Key] = set()
        """Own bookings the peers may hold (published, or in a snapshot they got)."""
        self._flush_at: asyncio.TimerHandle | None = None
        self._peers: dict[str, _Peer] = {}
        self._gen = itertools.count()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def key(self) -> str:
        return keys.events_key(self.namespace, self.component, self.instance_id)

    def peers(self) -> list[str]:
        return sorted(self._peers)

    def synced(self) -> bool:
        """Whether every known peer's stream has delivered something (its state)."""
        return all(peer.delivered for peer in self._peers.values())

    def own_bookings(self, model: str) -> int:
        return sum(1 for m, _, _ in self._own if m == model)

    def peer_bookings(self, model: str) -> int:
        """Other replicas' bookings of ``model`` in our load."""
        return sum(1 for p in self._peers.values() for m, _, _ in p.applied if m == model)

    def peer_total(self) -> int:
        """Other replicas' bookings in our load, all models together."""
        return sum(len(p.applied) for p in self._peers.values())

    def pending(self) -> int:
        """Other replicas' bookings waiting for their model or worker to be known here."""
        return sum(len(p.bookings) - len(p.applied) for p in self._peers.values())

    async def start(self) -> None:
        await self.publisher.start()
        # Seq 0 is our (empty) state, so that a subscriber always receives something and
        # knows it is in sync (a replay of an empty stream would answer nothing).
        self._publish(BookingState([]))
        jobs = {
            "watch": self._watch(),
            "apply": self._consume(),
            "reapply": self._reapply(),
            "ttl": self._sweep(),
        }
        for name, job in jobs.items():
            self._tasks.append(asyncio.create_task(job, name=f"bookings-{name}"))

    async def register(self) -> None:
        """Tell the other replicas where our stream is."""
        record = BookingsRecord(
            bookings=self.publisher.address,
            bookings_replay=self.publisher.replay_address,
            topic=TOPIC.decode(),
        )
        await self.discovery.register(self.key, encode_json(record))

    async def close(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._subscriber.close()
        await self.publisher.close()

    # ------------------------------------------------------------------ own bookings

    def booked(self, model: str, request_id: str, pool: BookingPool = "default") -> None:
        """``request_id`` was just booked by this replica's router for ``model``."""
        router = self.routers(model, pool)
        booking = router.load.booking(request_id) if router is not None else None
        if booking is None:
            return
        key = (model, pool, request_id)
        self._own[key] = time.monotonic()
        self._unsent.pop(key, None)  # a re-booking replaces what it had, at the peers too
        self._send(key, _booked(model, pool, request_id, booking))

    def released(
        self, model: str, request_id: str, kind: RouteEventKind, pool: BookingPool = "default"
    ) -> None:
        """A frontend reports progress of a request this replica booked."""
        key = (model, pool, request_id)
        if key not in self._own:
            return  # never ours, or expired
        router = self.routers(model, pool)
        unsent = self._unsent.get(key)
        if kind == "first_token":
            if router is not None:
                router.on_first_token(request_id)
            if isinstance(unsent, Booked):  # not published yet: published without prefill
                unsent.prefill_tokens = 0
                return
        else:
            del self._own[key]
            if router is not None:
                router.on_finished(request_id)
            if key not in self._shown:  # the peers never heard of it: nothing to tell
                self._unsent.pop(key, None)
                return
        self._send(key, Released(model, request_id, kind, pool))

    def _send(self, key: Key, change: Booked | Released) -> None:
        """Publish ``change`` with the others of this interval (at once when 0)."""
        self._unsent[key] = change
        if self.flush_interval <= 0:
            self._flush()
        elif self._flush_at is None:
            loop = asyncio.get_running_loop()
            self._flush_at = loop.call_later(self.flush_interval, self._flush)

    def _flush(self) -> None:
        self._flush_at = None
        changes = list(self._unsent.values())
        for key, change in self._unsent.items():
            if isinstance(change, Booked):
                self._shown.add(key)
            elif change.kind == "finished":
                self._shown.discard(key)
        self._unsent.clear()
        if changes:
            self._publish(changes[0] if len(changes) == 1 else BookingChanges(changes))

    def _publish(self, message: BookingMessage) -> None:
        self.publisher.publish(wire_router.encode(message))

    def _snapshot(self) -> tuple[int, bytes]:
        state: list[Booked] = []
        for model, pool, rid in self._own:
            router = self.routers(model, pool)
            booking = router.load.booking(rid) if router is not None else None
            if booking is not None:
                state.append(_booked(model, pool, rid, booking))
                # Its subscriber holds it now: its release must reach it, unsent or not.
                self._shown.add((model, pool, rid))
        return self.publisher.next_seq - 1, wire_router.encode(BookingState(state))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.ttl / 4))
            cutoff = time.monotonic() - self.ttl
            for (model, pool, rid), at in list(self._own.items()):
                if at < cutoff:
                    self.expired += 1
                    log.warning("booking %s of %s expired after %.0fs", rid, model, self.ttl)
                    self.released(model, rid, "finished", pool)

    # ------------------------------------------------------------------ peers

    async def _watch(self) -> None:
        prefix = keys.events_prefix(self.namespace, self.component)
        async for event in self.discovery.watch(prefix):
            iid = event.key.rpartition("/")[2]
            if iid == self.instance_id:
                continue
            record = None
            if event.kind is EventKind.PUT:
                assert event.value is not None
                try:
                    record = decode_json(event.value, BookingsRecord)
                except (ValueError, msgspec.DecodeError) as exc:
                    log.warning("ignoring %s: %s", event.key, exc)
                    continue
            async with self._lock:
                peer = self._peers.get(iid)
                if peer is not None and peer.record != record:
                    await self._drop(iid, peer)
                    log.info("router replica %s left: its bookings are dropped", iid)
                if record is not None and iid not in self._peers:
                    await self._add(iid, record)
                    log.info("router replica %s joined: applying its bookings", iid)

    async def _add(self, iid: str, record: BookingsRecord) -> None:
        peer = self._peers[iid] = _Peer(record, next(self._gen))
        await self._subscriber.add_publisher(
            f"{iid}#{peer.gen}", record.bookings, record.bookings_replay
        )

    async def _drop(self, iid: str, peer: _Peer) -> None:
        del self._peers[iid]
        await self._subscriber.remove_publisher(f"{iid}#{peer.gen}")
        self._forget(iid, peer)

    def _forget(self, iid: str, peer: _Peer) -> None:
        """Take everything of ``peer`` out of our load."""
        for model, pool, rid in peer.applied:
            router = self.routers(model, pool)
            if router is not None:
                router.load.finish(mirror_key(iid, rid))
        peer.applied.clear()
        peer.bookings.clear()

    async def _consume(self) -> None:
        async for item in self._subscriber:
            iid, _, gen = item.publisher_id.rpartition("#")
            peer = self._peers.get(iid)
            if peer is None or int(gen) != peer.gen:
                continue  # dropped or resynced meanwhile
            first, peer.delivered = not peer.delivered, True
            try:
                await self._on_item(iid, peer, item, first)
            except Exception:  # a bad payload must not stop the other peers' streams
                log.exception("bad bookings item from router replica %s", iid)
                self._forget(iid, peer)

    async def _on_item(self, iid: str, peer: _Peer, item: Item, first: bool) -> None:
        if isinstance(item, Event | Snapshot):
            self._apply(iid, peer, wire_router.decode_booking(item.payload))
        else:  # Lost: what we mirror may be wrong; a fresh subscription answers a snapshot
            self._forget(iid, peer)
            rebuilds = item.reason == "restart" and item.last_missing < item.first_missing
            if first or rebuilds or time.monotonic() - peer.last_resync < self.resync_interval:
                return
            async with self._lock:
                if self._peers.get(iid) is peer:
                    await self._subscriber.remove_publisher(f"{iid}#{peer.gen}")
                    peer.gen, peer.delivered = next(self._gen), False
                    peer.last_resync = time.monotonic()
                    record = peer.record
                    await self._subscriber.add_publisher(
                        f"{iid}#{peer.gen}", record.bookings, record.bookings_replay
                    )

    def _apply(self, iid: str, peer: _Peer, message: BookingMessage) -> None:
        if isinstance(message, BookingChanges):
            for change in message.changes:
                self._apply(iid, peer, change)
        elif isinstance(message, Booked):
            peer.bookings[_key(message)] = message
            self._book(iid, peer, message)
        elif isinstance(message, BookingState):  # the whole state: replaces what we had
            self._forget(iid, peer)
            for booked in message.bookings:
                peer.bookings[_key(booked)] = booked
                self._book(iid, peer, booked)
        else:
            key = _key(message)
            router = self.routers(message.model, message.pool) if key in peer.applied else None
            if message.kind == "first_token":
                if (waiting := peer.bookings.get(key)) is not None:
                    waiting.prefill_tokens = 0
                if router is not None:
                    router.load.first_token(mirror_key(iid, message.request_id))
            else:
                peer.bookings.pop(key, None)
                peer.applied.discard(key)
                if router is not None:
                    router.load.finish(mirror_key(iid, message.request_id))

    def _book(self, iid: str, peer: _Peer, booked: Booked) -> None:
        """Put one of ``peer``'s bookings into our load, or leave it pending while its
        model or worker is unknown here (we started, or learnt of it, after the peer)."""
        key = _key(booked)
        router = self.routers(booked.model, booked.pool)
        if router is None or booked.worker_id not in router:
            peer.applied.discard(key)
            return
        booking = Booking(booked.worker_id, booked.prefill_tokens, booked.hashes)
        router.load.book(mirror_key(iid, booked.request_id), booking)
        if router.approx is not None:  # kv-approx learns from every replica's decisions
            router.approx.record(booked.worker_id, booked.hashes)
        peer.applied.add(key)

    async def _reapply(self) -> None:
        """Book pending peer bookings once their worker is known, and again those our
        load dropped (their worker restarted, their model's router was replaced)."""
        while True:
            await asyncio.sleep(self.reapply_interval)
            for iid, peer in self._peers.items():
                for key, booked in peer.bookings.items():
                    router = self.routers(key[0], key[1]) if key in peer.applied else None
                    if router is None or router.load.booking(mirror_key(iid, key[2])) is None:
                        self._book(iid, peer, booked)


def _booked(model: str, pool: BookingPool, request_id: str, booking: Booking) -> Booked:
    hashes = booking.hashes if isinstance(booking.hashes, list) else list(booking.hashes)
    return Booked(model, request_id, booking.worker_id, booking.prefill_tokens, hashes, pool)


def _key(message: Booked | Released) -> Key:
    return (message.model, message.pool, message.request_id)
