"""The frontend as a client of ``dynamoctl router`` (``--router standalone``).

Replicas are found in discovery (``{ns}/instances/router/route/*``). Each pick is one
request-plane call, spread round-robin over the replicas. A replica that fails a call
(killed, stalled past ``route_timeout``, erroring) is tried last for ``suspect_for``
seconds and the call moves on to the next one, so a replica killed mid-call costs one
timeout, not a failed request. Only prompt token ids go to the router; tokens stream
from the worker it names.

Disaggregation: every reply says whether the model has prefill or decode workers, how
many prefill workers are alive and (for a disaggregated model) the decode pool's best
cached prefix, so a request's first pick doubles as the survey of its pools; picks name
their pool (``prefill``; ``decode`` after a remote prefill).

Progress notifications (first token, finished) go to the replica (and pool) that booked
the request, batched by a background task: they never hold up a token stream, and one
lost with its replica is harmless (that replica's bookings die with it, docs/router.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Iterator

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.discovery.hold import address_answers
from dynamoctl.frontend.generate import NoWorkerAvailable, WorkerChoice
from dynamoctl.frontend.picking import PoolSurvey
from dynamoctl.planes.request import RemoteError, RequestClient, RequestPlaneError
from dynamoctl.router.pools import booking_pool
from dynamoctl.util.aio import AsyncService, BackgroundTasks
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.records import Component, Endpoint, InstanceRecord, decode_json
from dynamoctl.wire.router import (
    BookingPool,
    RouteAnswer,
    RouteEvent,
    RoutePool,
    RouteRefused,
    RouteReply,
    RouteRequest,
)

log = logging.getLogger(__name__)

COMPONENT = Component.ROUTER
ROUTE = Endpoint.ROUTE
"""The router's request-plane endpoint (:mod:`dynamoctl.wire.router`)."""


class NoRouterAvailable(NoWorkerAvailable):
    """No router replica answered (a 503, as when no worker can take the request)."""

    def __init__(self, message: str, failed: list[str]) -> None:
        super().__init__(message)
        self.failed = failed
        """Replicas that failed the call (they may have booked it nonetheless)."""


class RouterReplicas(AsyncService):
    """The live router replicas of a namespace and the calls to them."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        *,
        timeout: float = 1.0,
        suspect_for: float = 5.0,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.timeout = timeout
        """Seconds a call may take before the next replica is asked."""
        self.suspect_for = suspect_for
        """Seconds a replica that failed a call is tried only after the others."""
        self.client = RequestClient(heartbeat_interval=0.5, heartbeat_timeout=2.0)
        self.failovers = 0
        """Calls that a replica failed and another one was asked (or none was left)."""
        self.notes_dropped = 0
        """Notifications that could not be delivered (their replica left or failed)."""
        self._replicas: dict[str, str] = {}  # instance id -> address
        self._suspect: dict[str, float] = {}  # instance id -> until when
        self._turn = itertools.count()
        self._notes: asyncio.Queue[tuple[str, RouteEvent]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._sending = BackgroundTasks()

    def replicas(self) -> dict[str, str]:
        """Instance id → request-plane address of every replica in discovery."""
        return dict(self._replicas)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="router-replicas"),
            asyncio.create_task(self._notifier(), name="router-notes"),
        ]

    async def close(self) -> None:
        for task in [*self._tasks, *self._sending]:
            task.cancel()
        for task in [*self._tasks, *self._sending]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.client.close()

    # ------------------------------------------------------------------ calls

    async def call(self, body: bytes) -> tuple[str, RouteAnswer, list[str]]:
        """Ask replicas in turn until one answers: ``(its id, its answer, the ids of
        those that failed first)``. :class:`NoRouterAvailable` when none answers."""
        order = self._order()
        if not order:
            raise NoRouterAvailable(
                f"no router replica in discovery ({keys.instances_prefix(self.namespace)}"
                f"{COMPONENT}/{ROUTE}/): is `dynamoctl router -n {self.namespace}` running?",
                [],
            )
        failed: list[str] = []
        errors: list[str] = []
        for iid, address in order:
            try:
                answer = await asyncio.wait_for(self._call_one(address, body), self.timeout)
            except (RequestPlaneError, asyncio.TimeoutError) as exc:
                self.failovers += 1
                self._suspect[iid] = time.monotonic() + self.suspect_for
                failed.append(iid)
                errors.append(f"{iid}: {type(exc).__name__} {exc}".rstrip())
                log.warning("router replica %s failed a call (%s); failing over", iid, errors[-1])
                continue
            self._suspect.pop(iid, None)
            return iid, answer, failed
        raise NoRouterAvailable(f"no router replica answered: {'; '.join(errors)}", failed)

    def notify(self, iid: str, event: RouteEvent) -> None:
        """Send ``event`` to replica ``iid`` soon (batched, best effort)."""
        self._notes.put_nowait((iid, event))

    def _order(self) -> list[tuple[str, str]]:
        items = list(self._replicas.items())
        if not items:
            return []
        k = next(self._turn) % len(items)
        rotated = items[k:] + items[:k]
        now = time.monotonic()
        healthy = [r for r in rotated if self._suspect.get(r[0], 0.0) <= now]
        return healthy + [r for r in rotated if r not in healthy]

    async def _call_one(self, address: str, body: bytes) -> RouteAnswer:
        chunks = [chunk async for chunk in self.client.stream(address, ROUTE, body)]
        if len(chunks) != 1:
            raise RemoteError(f"router answered {len(chunks)} chunks, expected 1")
        try:
            return wire_router.decode_answer(chunks[0])
        except msgspec.DecodeError as exc:
            raise RemoteError(f"undecodable router answer: {exc}") from exc

    async def _notifier(self) -> None:
        while True:
            iid, event = await self._notes.get()
            batches: dict[str, list[RouteEvent]] = {iid: [event]}
            while not self._notes.empty():
                iid, event = self._notes.get_nowait()
                batches.setdefault(iid, []).append(event)
            for iid, events in batches.items():  # one slow replica must not hold up others
                self._sending.spawn(self._send_notes(iid, events), name="router-note")

    async def _send_notes(self, iid: str, events: list[RouteEvent]) -> None:
        address = self._replicas.get(iid)
        if address is None:
            self.notes_dropped += len(events)
            return
        body = wire_router.encode(wire_router.RouteNotify(events))
        try:
            await asyncio.wait_for(self._drain(address, body), self.timeout)
        except (RequestPlaneError, asyncio.TimeoutError) as exc:
            self.notes_dropped += len(events)
            log.debug("%d notification(s) to router %s lost: %r", len(events), iid, exc)

    async def _drain(self, address: str, body: bytes) -> None:
        async for _ in self.client.stream(address, ROUTE, body):
            pass

    # ------------------------------------------------------------------ discovery

    async def _answers(self, key: str) -> bool:
        """Whether a replica whose record is held still accepts connections."""
        address = self._replicas.get(key.rpartition("/")[2])
        return address is not None and await address_answers(address)

    async def _watch(self) -> None:
        # Held while discovery settles: replicas that answer are asked as before.
        prefix = keys.instances_prefix(self.namespace, COMPONENT)
        async for event in self.discovery.watch(prefix, hold=True, alive=self._answers):
            try:
                _, _, endpoint, iid = keys.split_instance_key(event.key)
                if endpoint != ROUTE:
                    continue
                old = self._replicas.pop(iid, None)
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    address = decode_json(event.value, InstanceRecord).address
                    self._replicas[iid] = address
                    log.info("router replica %s at %s", iid, address)
                else:
                    self._suspect.pop(iid, None)
                    log.info("router replica %s left", iid)
                if old is not None and old != self._replicas.get(iid):
                    await self.client.disconnect(old)  # its open calls fail over now
            except (ValueError, msgspec.DecodeError) as exc:
                log.warning("ignoring router record %s: %s", event.key, exc)


class RemotePicker:
    """A :class:`~dynamoctl.frontend.picking.WorkerPicker` for one model that asks the
    router replicas (they keep a model's prefill workers apart and name the pool's facts
    in every reply)."""

    def __init__(self, model: str, replicas: RouterReplicas) -> None:
        self.model = model
        self.replicas = replicas
        self._owner: dict[tuple[str, BookingPool], str] = {}  # -> replica holding the booking
        self._disaggregated: bool | None = None  # as the last reply said; None: no reply yet
        self._prefill_workers = 0
        self._surveyed: dict[str, tuple[list[int], WorkerChoice]] = {}
        """Picks made by :meth:`survey`, kept for the request's first :meth:`pick`."""

    async def pick(self, token_ids: list[int], request_id: str, exclude: set[str]) -> WorkerChoice:
        kept = self._surveyed.pop(request_id, None)
        if kept is not None and not exclude and kept[0] == token_ids:
            return kept[1]
        reply = await self._pick("default", token_ids, request_id, exclude)
        return WorkerChoice(reply.worker_id, reply.address, reply.label)

    def first_token(self, request_id: str) -> None:
        iid = self._owner.get((request_id, "default"))
        if iid is not None:
            self._notify(iid, request_id, "first_token", "default")

    def finished(self, request_id: str) -> None:
        self._surveyed.pop(request_id, None)
        iid = self._owner.pop((request_id, "default"), None)
        if iid is not None:
            self._notify(iid, request_id, "finished", "default")

    async def close(self) -> None:
        """Nothing of its own: the replicas are shared by every model."""

    # -- disaggregation -------------------------------------------------

    def disaggregated(self) -> bool:
        return True if self._disaggregated is None else self._disaggregated

    async def survey(self, token_ids: list[int], request_id: str) -> PoolSurvey:
        try:
            reply = await self._pick("default", token_ids, request_id, set())
        except NoWorkerAvailable:  # pick() asks again (and queues, or answers 503)
            return PoolSurvey(self._prefill_workers, 0)
        self._surveyed[request_id] = (
            token_ids,
            WorkerChoice(reply.worker_id, reply.address, reply.label),
        )
        return PoolSurvey(reply.prefill_workers, reply.decode_cached_tokens)

    async def pick_prefill(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        reply = await self._pick("prefill", token_ids, request_id, exclude)
        return WorkerChoice(reply.worker_id, reply.address, reply.label)

    def prefill_finished(self, request_id: str) -> None:
        iid = self._owner.pop((request_id, "prefill"), None)
        if iid is not None:
            self._notify(iid, request_id, "finished", "prefill")

    async def pick_decode(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        self._surveyed.pop(request_id, None)  # re-booked without overlap credit
        reply = await self._pick("decode", token_ids, request_id, exclude)
        return WorkerChoice(reply.worker_id, reply.address, reply.label)

    # -- calls --------------------------------------------------------------------------

    async def _pick(
        self, pool: RoutePool, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> RouteReply:
        booked = booking_pool(pool)
        request = RouteRequest(self.model, request_id, token_ids, sorted(exclude), pool)
        try:
            iid, answer, failed = await self.replicas.call(wire_router.encode(request))
        except NoRouterAvailable as exc:
            for other in exc.failed:
                self._notify(other, request_id, "finished", booked)
            raise
        # A replica that failed the call may still have booked it; so may the previous
        # owner of a migrating (or re-picked) request, when another replica answered.
        key = (request_id, booked)
        previous = self._owner.get(key)
        stale = [*failed, previous] if previous not in (None, iid) else failed
        for other in stale:
            self._notify(other, request_id, "finished", booked)
        if previous != iid:
            self._owner.pop(key, None)
        if isinstance(answer, RouteRefused):
            raise NoWorkerAvailable(answer.message, busy=answer.reason == "busy")
        self._owner[key] = iid
        self._disaggregated, self._prefill_workers = answer.disaggregated, answer.prefill_workers
        return answer

    def _notify(
        self,
        iid: str | None,
        request_id: str,
        kind: wire_router.RouteEventKind,
        pool: BookingPool,
    ) -> None:
        if iid is not None:
            self.replicas.notify(iid, RouteEvent(self.model, request_id, kind, pool))


class StandaloneRouting(AsyncService):
    """Routing by the ``dynamoctl router`` replicas of the namespace."""

    def __init__(self, discovery: Discovery, namespace: str, route_timeout: float) -> None:
        self.replicas = RouterReplicas(discovery, namespace, timeout=route_timeout)

    async def start(self) -> None:
        await self.replicas.start()

    async def close(self) -> None:
        await self.replicas.close()

    async def make_picker(self, model: str, card: object) -> RemotePicker:
        return RemotePicker(model, self.replicas)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_ReplicasCollector(self.replicas))


class _ReplicasCollector(Collector):
    """The frontend's view of the router replicas (names in docs/metrics.md)."""

    def __init__(self, replicas: RouterReplicas) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        prefix = "dynamoctl_frontend_router_"
        r = self.replicas
        yield GaugeMetricFamily(
            prefix + "replicas", "Router replicas in discovery.", value=len(r.replicas())
        )
        yield CounterMetricFamily(
            prefix + "failovers", "Route calls a replica failed (another one was asked).",
            value=r.failovers,
        )  # fmt: skip
        yield CounterMetricFamily(
            prefix + "notifications_dropped",
            "Booking releases not delivered (their replica failed or left).",
            value=r.notes_dropped,
        )
