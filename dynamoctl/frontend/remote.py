"""The frontend as a client of ``dynamoctl router`` (``--router standalone``).

Each pick is one call of the router's client (:mod:`dynamoctl.router.standalone.client`:
replicas from discovery, round-robin, failover within ``route_timeout``). Only prompt
token ids go to the router; tokens stream from the worker it names.

Disaggregation: every reply says whether the model has prefill or decode workers, how
many prefill workers are alive and (for a disaggregated model) the decode pool's best
cached prefix, so a request's first pick doubles as the survey of its pools; picks name
their pool (``prefill``; ``decode`` after a remote prefill).

Progress notifications (first token, finished) go to the replica (and pool) that booked
the request, batched by a background task: they never hold up a token stream, and one
lost with its replica is harmless (that replica's bookings die with it, docs/router.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.generate import NoWorkerAvailable, WorkerChoice
from dynamoctl.frontend.picking import PoolSurvey
from dynamoctl.frontend.tenants.service import current_headroom
from dynamoctl.router.pools import booking_pool
from dynamoctl.router.standalone.client import NoRouterAvailable, RouterReplicas
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.ids import TokenIds, packed
from dynamoctl.wire.router import (
    BookingPool,
    RouteEvent,
    RoutePool,
    RouteRefused,
    RouteReply,
    RouteRequest,
)


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
        self._surveyed: dict[str, tuple[TokenIds, WorkerChoice]] = {}
        """Picks made by :meth:`survey`, kept for the request's first :meth:`pick`."""

    async def pick(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        kept = self._surveyed.pop(request_id, None)
        if kept is not None and not exclude and kept[0] == packed(token_ids):
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

    async def survey(self, token_ids: Sequence[int], request_id: str) -> PoolSurvey:
        try:
            reply = await self._pick("default", token_ids, request_id, set())
        except NoWorkerAvailable:  # pick() asks again (and queues, or answers 503)
            return PoolSurvey(self._prefill_workers, 0)
        self._surveyed[request_id] = (
            packed(token_ids),  # compared as arrays: a list never equals an array
            WorkerChoice(reply.worker_id, reply.address, reply.label),
        )
        return PoolSurvey(reply.prefill_workers, reply.decode_cached_tokens)

    async def pick_prefill(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        reply = await self._pick("prefill", token_ids, request_id, exclude)
        return WorkerChoice(reply.worker_id, reply.address, reply.label)

    def prefill_finished(self, request_id: str) -> None:
        iid = self._owner.pop((request_id, "prefill"), None)
        if iid is not None:
            self._notify(iid, request_id, "finished", "prefill")

    async def pick_decode(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        self._surveyed.pop(request_id, None)  # re-booked without overlap credit
        reply = await self._pick("decode", token_ids, request_id, exclude)
        return WorkerChoice(reply.worker_id, reply.address, reply.label)

    # -- calls --------------------------------------------------------------------------

    async def _pick(
        self, pool: RoutePool, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> RouteReply:
        booked = booking_pool(pool)
        request = RouteRequest(
            self.model, request_id, packed(token_ids), sorted(exclude), pool, current_headroom()
        )
        try:
            iid, answer, failed = await self.replicas.call(wire_router.encode(request))
        except NoRouterAvailable as exc:
            for other in exc.failed:
                self._notify(other, request_id, "finished", booked)
            raise NoWorkerAvailable(str(exc)) from exc  # a 503, as when no worker can take it
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
