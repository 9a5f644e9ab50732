"""One serving instance: an engine behind the request plane, its events published, its
existence registered in discovery.

Start order makes the registration mean "ready": engine, event publishers and request
server come up first, then the events record, the model card and, last, the instance
record that routers act on. Drain runs the other way round: the instance and model
records go first (routers stop sending), in-flight requests finish within a grace
period, stragglers are aborted (their streams end with ``finish_reason: abort``, which
the frontend migrates), hand-offs still waiting for a peer (:class:`HoldsPeerWork`: a
prefill's pinned KV) get the rest of that period, and only then does everything close.

An engine that dies (its process killed, its loop failed) takes the instance down with it:
:meth:`WorkerInstance.watch_engine` notices (the engine reports it, :class:`ReportsDeath`,
or a stream fails with :class:`EngineStopped`), ends every in-flight stream with
``abort`` (the frontend migrates them), deregisters, and the process exits non-zero.

An engine that publishes its KV events itself (vLLM: :class:`PublishesKvEvents`) has its
own stream registered instead of ours, so routers read the engine's events unchanged.

Role ``prefill`` (docs/architecture.md): every request runs as a prefill, ``max_tokens=1`` with the
engine's own "prefill for a remote decode" marker (:class:`PrefillsForRemoteDecode`)
merged into its ``kv_transfer_params``; the chunks carry the engine's hand-off back. The
frontend only moves that hand-off to a decode worker, so it stays engine-agnostic. An
engine that serves peers (:class:`ServesPeers`: the mocker's ``kv_pull``) gets its
endpoints on this instance's request server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys
from dynamoctl.engines.api import (
    Engine,
    EngineStopped,
    GenerateChunk,
    HoldsPeerWork,
    KvEventSource,
    PrefillsForRemoteDecode,
    PublishesKvEvents,
    ReportsDeath,
    ServesAdapters,
    ServesPeers,
)
from dynamoctl.planes.curve import deployment_keys
from dynamoctl.planes.events import EventPublisher
from dynamoctl.planes.events.relay import KvEventRelay, node_local
from dynamoctl.planes.request import NotAccepting, RequestServer
from dynamoctl.settings import Role
from dynamoctl.wire.kv_events import KVEventBatch, encode_batch
from dynamoctl.wire.records import Component, Endpoint
from dynamoctl.wire.structured import OutputTraits
from dynamoctl.worker.adapters import WorkerAdapters
from dynamoctl.worker.kv_state import KvCacheState

if TYPE_CHECKING:  # OpenTelemetry is imported only when tracing is on
    from dynamoctl.tracing.spans import Tracer

log = logging.getLogger(__name__)

COMPONENT = Component.WORKER
GENERATE = Endpoint.GENERATE
"""Request-plane endpoint name: body a GenerateRequest, chunks GenerateChunks."""
KV_TOPIC = b"kv-events"
LOAD_TOPIC = b"load"


class WorkerDraining(NotAccepting):
    """The worker no longer takes requests; the client sees ``Overloaded`` and picks
    another."""


def _prefill_marker(engine: Engine, role: Role) -> Mapping[str, Any] | None:
    """What a prefill worker adds to each request's KV transfer parameters (None: not a
    prefill worker); an engine that cannot prefill for a remote decode is refused the role."""
    if role != "prefill":
        return None
    if not isinstance(engine, PrefillsForRemoteDecode):
        raise ValueError(
            f"engine {type(engine).__name__} cannot serve role prefill (it does not "
            "prefill for a remote decode); use role agg or decode"
        )
    return engine.remote_prefill_params() or {}


class WorkerInstance:
    """An engine served on the request plane, publishing KV events and load."""

    def __init__(
        self,
        engine: Engine,
        discovery: Discovery,
        *,
        namespace: str,
        role: Role = "agg",
        host: str = "127.0.0.1",
        instance_id: str | None = None,
        metrics_url: str | None = None,
        health_url: str | None = None,
        label: str = "",
        load_interval: float = 0.05,
        load_heartbeat: float = 1.0,
        traits: OutputTraits | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.engine = engine
        self.tracer = tracer
        """Traces each request's spans (docs/operations.md, "Traces"); None: off."""
        self.discovery = discovery
        self.namespace = namespace
        self.role = role
        self.host = host
        self.instance_id = instance_id or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.metrics_url = metrics_url
        self.health_url = health_url
        self.label = label
        self.load_interval = load_interval
        """Seconds between checks for changed load (published when it changed)."""
        self.load_heartbeat = load_heartbeat
        """Seconds after which load is published even if unchanged."""
        self.traits = traits
        """The engine's name and the model's output parsers, for the model card."""
        self.kv_state = KvCacheState()
        self.server = RequestServer(f"tcp://{host}:0")
        self.kv_events = EventPublisher(
            f"tcp://{host}:0", f"tcp://{host}:0", topic=KV_TOPIC, snapshot=self._kv_snapshot
        )
        self.load_events = EventPublisher(
            f"tcp://{host}:0", f"tcp://{host}:0", topic=LOAD_TOPIC, snapshot=self._load_snapshot
        )
        self._kv_relay: KvEventRelay | None = None
        """Carries an engine's node-local KV stream under CURVE, when it has one."""
        self._kv_source: KvEventSource | None = None
        self._kv_ours = True
        self.standby = False
        """A warm spare not promoted yet: ready, registered as standby, out of routing."""
        self.draining = False
        self.stopping = False
        """Set (synchronously, from the signal handler) when the process is told to stop:
        an engine that dies from then on is part of the shutdown (a process-group SIGTERM
        reaches vLLM's and SGLang's engine processes too), not a death to report."""
        self.inflight = 0
        self.requests_total = 0
        self.tokens_total = 0
        self.prompt_tokens_total = 0
        """Prompt tokens of requests that reached their first chunk, as every engine
        reports them there (with ``cached_tokens_total``: the per-worker prefix hit rate)."""
        self.cached_tokens_total = 0
        """Of those, tokens the engine did not compute (prefix cache, or pulled KV)."""
        self.remote_prefilled_total = 0
        """Requests that arrived with a prefill worker's hand-off."""
        self._prefill_marker = _prefill_marker(engine, role)
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_load: bytes = b""
        self.death: EngineStopped | None = None
        """Why the engine died, once it did (seen by a request or reported by it)."""
        self._died = asyncio.Event()
        self._load_task: asyncio.Task[None] | None = None
        self.adapters: WorkerAdapters | None = None
        """The LoRA adapters it holds, when its engine serves them (worker/adapters.py)."""
        if isinstance(engine, ServesAdapters) and engine.serves_adapters():
            self.adapters = WorkerAdapters(
                engine, discovery, namespace, self.instance_id, role, self._adapters_changed
            )
        self._adapters_task: asyncio.Task[None] | None = None

    # -- keys ------------------------------------------------------------------------

    @property
    def instance_key(self) -> str:
        return keys.instance_key(self.namespace, COMPONENT, GENERATE, self.instance_id)

    @property
    def model_key(self) -> str:
        return keys.model_key(self.namespace, self.engine.model_card.model, self.instance_id)

    @property
    def standby_key(self) -> str:
        """Where a warm spare says it runs (never read by routers)."""
        return keys.instance_key(self.namespace, Component.STANDBY, GENERATE, self.instance_id)

    @property
    def events_key(self) -> str:
        return keys.events_key(self.namespace, COMPONENT, self.instance_id)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, standby: bool = False) -> None:
        """Start the engine and the planes, then register (ready); a warm spare
        (``standby``) registers as standby instead, until :meth:`promote`."""
        engine = self.engine
        engine.set_kv_event_sink(self._on_kv_batch)
        own = engine if isinstance(engine, PublishesKvEvents) else None
        if own is not None:
            own.set_kv_event_host(self.host)
        else:
            await self.kv_events.start()  # before the engine: its first events need it
        await self.load_events.start()
        await engine.start()
        kv = own.kv_event_source() if own is not None else None
        ours = kv is None  # the engine's own publisher cannot speak CURVE
        if kv is not None and deployment_keys() is not None and node_local(kv.address):
            # ... but a relay on this node can carry it under CURVE (planes/events/relay.py)
            self._kv_relay = KvEventRelay(kv.address, kv.replay_address, self.host)
            address, replay = await self._kv_relay.start()
            kv, ours = dataclasses.replace(kv, address=address, replay_address=replay), True
        if kv is None:
            if own is not None:  # it publishes none (events off): advertise an empty stream
                await self.kv_events.start()
            kv = KvEventSource(
                self.kv_events.address, self.kv_events.replay_address, KV_TOPIC.decode()
            )
        generate: Callable[[bytes], AsyncIterator[bytes]] = (
            self._generate
        )  # tracing off: the plain handler, nothing in between
        if self.tracer is not None:
            generate = self.tracer.serving(self._generate, self.role)
        self.server.register(GENERATE, generate)
        peers = engine if isinstance(engine, ServesPeers) else None
        if peers is not None:
            for name, handler in peers.peer_endpoints().items():
                self.server.register(name, handler)
        await self.server.start()
        if peers is not None:
            peers.set_peer_address(self.server.address)
        self._load_task = asyncio.create_task(self._publish_load(), name="worker-load")
        self._kv_source, self._kv_ours = kv, ours
        if standby:
            self.standby = True
            await self.discovery.register(self.standby_key, self._record(Component.STANDBY))
            log.info("[%s] standby: a warm spare, out of routing", self.instance_id)
            return
        await self.register()

    async def promote(self) -> None:
        """A warm spare joins routing: its standby record goes, its worker records come
        (the same order as a start's, so the instance record still means ready)."""
        await self.discovery.unregister(self.standby_key)
        await self.register()
        self.standby = False

    def _record(self, component: Component) -> bytes:
        return wire.encode_json(
            wire.InstanceRecord(
                instance_id=self.instance_id,
                component=component,
                endpoint=GENERATE,
                address=self.server.address,
                host=socket.gethostname(),
                pid=os.getpid(),
                role=self.role,
                model=self.engine.model_card.model,
                metrics_url=self.metrics_url,
                health_url=self.health_url,
                label=self.label,
                adapters=sorted(self.adapters.loaded) if self.adapters is not None else [],
            )
        )

    async def _adapters_changed(self) -> None:
        if not (self.standby or self.draining):
            await self.discovery.register(self.instance_key, self._record(COMPONENT))

    def _own_keys(self) -> tuple[str, ...]:
        """Every key that routes requests here or marks it a spare: what leaves first."""
        cards = self.adapters.card_keys() if self.adapters is not None else []
        return (self.instance_key, self.model_key, self.standby_key, *cards)

    async def register(self) -> None:
        """The events record, the model card, then the instance record routers act on."""
        kv, ours = self._kv_source, self._kv_ours
        assert kv is not None, "start() runs first"
        card = self.engine.model_card
        if self.traits is not None:
            card = msgspec.structs.replace(card, traits=self.traits)
        await self.discovery.register(
            self.events_key,
            wire.encode_json(
                wire.EventsRecord(
                    kv=kv.address,
                    kv_replay=kv.replay_address,
                    kv_topic=kv.topic,
                    load=self.load_events.address,
                    load_replay=self.load_events.replay_address,
                    load_topic=LOAD_TOPIC.decode(),
                    kv_curve=ours,
                    silent_tiers=dict(kv.silent_tiers),
                )
            ),
        )
        await self.discovery.register(self.model_key, wire.encode_json(card))
        await self.discovery.register(self.instance_key, self._record(COMPONENT))
        if self.adapters is not None and self._adapters_task is None:
            self._adapters_task = asyncio.create_task(
                self.adapters.follow(card), name="worker-adapters"
            )
        log.info(
            "[%s] ready: %s serving %s on %s",
            self.instance_id,
            self.role,
            card.model,
            self.server.address,
        )

    async def drain(self, grace: float) -> int:
        """Stop taking requests, let in-flight ones finish for up to ``grace`` seconds,
        abort the rest. Returns how many were aborted."""
        self.draining = True
        for key in self._own_keys():
            try:
                await self.discovery.unregister(key)
            except Exception as exc:  # discovery down: the lease expiry removes them anyway
                log.warning("[%s] could not deregister %s: %s", self.instance_id, key, exc)
        log.info(
            "[%s] draining %d in-flight request(s), grace %.1fs",
            self.instance_id,
            self.inflight,
            grace,
        )
        deadline = time.monotonic() + grace
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        await self._wait_peer_work(deadline)
        aborted = self.inflight
        if aborted:
            log.warning("[%s] grace period over: aborting %d request(s)", self.instance_id, aborted)
            await self.engine.stop()  # every open stream ends with finish_reason=abort
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 5.0)
        return aborted

    async def _wait_peer_work(self, deadline: float) -> None:
        """Keep serving peers (decode workers pulling pinned prefills) until nothing is
        left for them or ``deadline``: closing would drop the KV and every decode not yet
        pulled would prefill again locally."""
        engine = self.engine
        if not isinstance(engine, HoldsPeerWork) or self.inflight:
            return
        pending = engine.pending_peer_work()
        if pending:
            log.info("[%s] waiting for peers to take %d hand-off(s)", self.instance_id, pending)
        while time.monotonic() < deadline:  # pulls and pin expiries: polled, both rare
            if not engine.pending_peer_work():
                break
            await asyncio.sleep(0.02)
        if left := engine.pending_peer_work():
            log.warning("[%s] grace period over: %d hand-off(s) never taken", self.instance_id,
                        left)  # fmt: skip

    async def close(self) -> None:
        for task in (self._load_task, self._adapters_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.server.close()
        await self.engine.stop()
        await self.kv_events.close()
        await self.load_events.close()
        if self._kv_relay is not None:
            await self._kv_relay.close()

    async def watch_engine(self) -> EngineStopped:
        """Wait until the engine dies, then fail its in-flight requests (``abort``) and
        deregister; returns the cause. Cancel it to stop watching."""
        waits: list[asyncio.Task[object]] = [asyncio.create_task(self._died.wait())]
        if isinstance(self.engine, ReportsDeath):
            waits.append(asyncio.create_task(self._reported_death(self.engine)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        failed = [t.exception() for t in waits if t.done() and not t.cancelled()]
        broken = next((exc for exc in failed if exc is not None), None)
        cause = self.death or EngineStopped(f"the engine's death watch failed: {broken!r}")
        if self.stopping:
            return cause  # a stop was asked for meanwhile: main drains instead
        self.death = cause
        log.error(
            "[%s] engine died: %s; ending %d open stream(s) with abort",
            self.instance_id,
            cause,
            self.inflight,
        )
        self.draining = True
        for key in self._own_keys():
            with contextlib.suppress(Exception):  # discovery down: the lease expiry removes it
                await self.discovery.unregister(key)
        # Open streams end with "abort" (or EngineStopped, which _generate turns into one).
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.engine.stop(), 30)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 5.0)
        return cause

    async def _reported_death(self, engine: ReportsDeath) -> None:
        cause = await engine.wait_dead()
        if self.stopping:  # dying as part of the shutdown: wait to be cancelled
            await asyncio.Event().wait()
        self.death = self.death or cause

    # -- request plane ---------------------------------------------------------------

    async def _generate(self, body: bytes) -> AsyncIterator[bytes]:
        if self.draining:
            raise WorkerDraining(f"worker {self.instance_id} is draining")
        request = wire.engine.decode_request(body)
        if request.kv_transfer_params is not None and self.role != "prefill":
            self.remote_prefilled_total += 1
        if self._prefill_marker is not None:
            params = {**(request.kv_transfer_params or {}), **self._prefill_marker}
            request = msgspec.structs.replace(
                request, max_tokens=1, kv_transfer_params=params or None
            )
        self.inflight += 1
        self.requests_total += 1
        self._idle.clear()
        finished = first = False
        try:
            async for chunk in self.engine.generate(request):
                if not first:
                    first = True
                    self.prompt_tokens_total += chunk.prompt_tokens or len(request.token_ids)
                    self.cached_tokens_total += chunk.cached_tokens or 0
                self.tokens_total += len(chunk.token_ids)
                finished = chunk.finish_reason is not None
                yield wire.engine.encode(chunk)
        except EngineStopped as exc:  # the engine is gone: "abort" makes the frontend migrate
            if not (self.draining or self.stopping) and self.death is None:
                self.death = exc
                self._died.set()
            finished = True  # nothing left to abort
            yield wire.engine.encode(GenerateChunk([], "abort"))
        finally:
            if not finished:  # cancelled by the client, its death, or close()
                await self.engine.abort(request.request_id)
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    # -- event plane -----------------------------------------------------------------

    def _on_kv_batch(self, batch: KVEventBatch) -> None:
        self.kv_state.apply(batch)
        self.kv_events.publish(encode_batch(batch))

    def _kv_snapshot(self) -> tuple[int, bytes]:
        # Same event loop as publish(): the state is exactly the one after the last seq.
        return self.kv_events.next_seq - 1, encode_batch(self.kv_state.snapshot())

    def _load_snapshot(self) -> tuple[int, bytes]:
        return self.load_events.next_seq - 1, self._encode_load()

    def _encode_load(self) -> bytes:
        return wire.engine.encode(self.engine.load_metrics())

    async def _publish_load(self) -> None:
        last_sent = 0.0
        while True:
            payload = self._encode_load()
            now = time.monotonic()
            if payload != self._last_load or now - last_sent >= self.load_heartbeat:
                self.load_events.publish(payload)
                self._last_load, last_sent = payload, now
            await asyncio.sleep(self.load_interval)
