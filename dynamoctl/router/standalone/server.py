"""The ``route`` endpoint of ``dynamoctl router``: per model (following model cards like
the frontend does) a :class:`~dynamoctl.router.pools.ModelPools`, a router over the agg
and decode workers and one over the prefill workers, answering frontends' route calls.

A :class:`~dynamoctl.wire.router.RouteRequest` runs ``KvRouter.pick`` in the pool it
names (which books the request's load there) and answers the worker's id and address,
plus what the frontend's disaggregation decision needs (the model is disaggregated,
prefill workers alive, the decode pool's best cached prefix), so that it takes no extra
call; a :class:`~dynamoctl.wire.router.RouteNotify` releases bookings. Both are mirrored
to the other replicas by :class:`~dynamoctl.router.standalone.bookings.BookingSync`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator

from dynamoctl.discovery import Discovery, keys
from dynamoctl.planes.request import RequestServer
from dynamoctl.router.errors import AllWorkersBusy, RouterError
from dynamoctl.router.models import ModelFollower
from dynamoctl.router.pools import ModelPools, booking_pool
from dynamoctl.router.router import KvRouter
from dynamoctl.router.settings import RouterSettings
from dynamoctl.router.standalone.bookings import BookingSync
from dynamoctl.settings import ReplicaSettings
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.engine import ModelCard
from dynamoctl.wire.records import Endpoint
from dynamoctl.wire.router import (
    BookingPool,
    RefusalReason,
    RouteAnswer,
    RouteNotify,
    RouteRefused,
    RouteReply,
    RouteRequest,
)

log = logging.getLogger(__name__)

ROUTE = Endpoint.ROUTE


class RouteServer(AsyncService):
    """Routers for every model of a namespace, served on the request plane."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        instance_id: str,
        settings: RouterSettings,
        *,
        host: str = "127.0.0.1",
        booking_ttl: float = ReplicaSettings.model_fields["booking_ttl"].default,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.instance_id = instance_id
        self.settings = settings
        self.models: ModelFollower[ModelPools] = ModelFollower(
            discovery, namespace, self._open, self._close
        )
        self.bookings = BookingSync(
            discovery, namespace, instance_id, self.router_of, host=host, ttl=booking_ttl
        )
        self.server = RequestServer(f"tcp://{host}:0")
        self.picks: Counter[tuple[str, str]] = Counter()
        """(model, outcome) → calls; outcome ``routed`` or a refusal reason."""
        self.notifications = 0

    def router_of(self, model: str, pool: BookingPool = "default") -> KvRouter | None:
        pools = self.models.get(model)
        return pools.router(pool) if pools is not None else None

    async def start(self) -> None:
        await self.bookings.start()
        await self.models.start()
        self.server.register(ROUTE, self._handle)
        await self.server.start()

    async def close(self) -> None:
        await self.server.close()
        await self.models.close()
        await self.bookings.close()

    async def warm_up(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every model in discovery now has a router
        with a worker and every other replica's bookings have arrived, so the first
        answers are informed ones. False if the time ran out."""
        found = await self.discovery.list(keys.models_prefix(self.namespace))
        prefix = len(keys.models_prefix(self.namespace))
        models = {key[prefix:].rpartition("/")[0] for key in found}
        deadline = time.monotonic() + timeout

        def ready() -> bool:
            routers = [self.router_of(m) for m in models]
            return all(r is not None and r.workers() for r in routers) and self.bookings.synced()

        while not ready():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def _open(self, model: str, card: ModelCard) -> ModelPools:
        def build() -> KvRouter:
            return KvRouter.from_settings(self.settings, card.block_size, card.adapter)

        pools = await ModelPools.open(self.discovery, self.namespace, model, build)
        log.info("routing %s (%s, block size %d)", model, self.settings.mode, card.block_size)
        return pools

    @staticmethod
    async def _close(pools: ModelPools) -> None:
        await pools.close()

    # ------------------------------------------------------------------ endpoint

    async def _handle(self, body: bytes) -> AsyncIterator[bytes]:
        call = wire_router.decode_call(body)
        if isinstance(call, RouteNotify):
            self.notifications += len(call.events)
            for event in call.events:
                self.bookings.released(event.model, event.request_id, event.kind, event.pool)
            return
        yield wire_router.encode(self.route(call))

    def route(self, request: RouteRequest) -> RouteAnswer:
        """Pick a worker and book the request on it (and tell the other replicas)."""
        model, rid, pool = request.model, request.request_id, request.pool
        pools = self.models.get(model)
        if pools is None:
            return self._refuse(
                model, "unknown_model", f"router {self.instance_id} knows no worker of {model!r}"
            )
        try:
            decision, record = pools.pick(
                pool, request.token_ids, rid, request.exclude, request.headroom
            )
        except AllWorkersBusy as exc:
            return self._refuse(model, "busy", str(exc))
        except RouterError as exc:
            return self._refuse(model, "no_workers", str(exc))
        self.bookings.booked(model, rid, booking_pool(pool))
        self.picks[model, "routed"] += 1
        disaggregated = pools.disaggregated()
        # Only a default pick of a disaggregated model is followed by the decision that
        # needs it: the aggregated path pays no second index walk.
        cached = (
            pools.decode_cached_tokens(request.token_ids)
            if disaggregated and pool == "default"
            else 0
        )
        return RouteReply(
            decision.worker_id, record.address, decision.overlap_blocks, decision.prompt_blocks,
            disaggregated, pools.prefill_workers(), cached, record.label,
        )  # fmt: skip

    def _refuse(self, model: str, reason: RefusalReason, message: str) -> RouteRefused:
        self.picks[model, reason] += 1
        return RouteRefused(reason, message)
