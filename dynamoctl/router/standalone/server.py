"""The ``route`` endpoint of ``dynamoctl router``: one :class:`RouterService` per model
(following model cards like the frontend does), answering frontends' route calls.

A :class:`~dynamoctl.wire.router.RouteRequest` runs ``KvRouter.pick`` (which books the
request's load) and answers the worker's id and address; a
:class:`~dynamoctl.wire.router.RouteNotify` releases bookings. Both are mirrored to the
other replicas by :class:`~dynamoctl.router.standalone.bookings.BookingSync`.
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
from dynamoctl.router.router import KvRouter
from dynamoctl.router.service import RouterService
from dynamoctl.router.settings import RouterSettings
from dynamoctl.router.standalone.bookings import BookingSync
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.engine import ModelCard
from dynamoctl.wire.router import (
    RefusalReason,
    RouteAnswer,
    RouteNotify,
    RouteRefused,
    RouteReply,
    RouteRequest,
)

log = logging.getLogger(__name__)

ROUTE = "route"


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
        booking_ttl: float = 600.0,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.instance_id = instance_id
        self.settings = settings
        self.models: ModelFollower[RouterService] = ModelFollower(
            discovery, namespace, self._open, self._close
        )
        self.bookings = BookingSync(
            discovery, namespace, instance_id, self.router_of, host=host, ttl=booking_ttl
        )
        self.server = RequestServer(f"tcp://{host}:0")
        self.picks: Counter[tuple[str, str]] = Counter()
        """(model, outcome) → calls; outcome ``routed`` or a refusal reason."""
        self.notifications = 0

    def router_of(self, model: str) -> KvRouter | None:
        service = self.models.get(model)
        return service.router if service is not None else None

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

    async def _open(self, model: str, card: ModelCard) -> RouterService:
        router = self.settings.build(card.block_size)
        # Aggregated only: prefill workers only prefill (their role), so a standalone
        # router never sends them a whole request (docs/architecture.md, P/D).
        service = RouterService(
            self.discovery, self.namespace, model, router, roles=("agg", "decode")
        )
        await service.start()
        log.info("routing %s (%s, block size %d)", model, router.mode, card.block_size)
        return service

    @staticmethod
    async def _close(service: RouterService) -> None:
        await service.close()

    # ------------------------------------------------------------------ endpoint

    async def _handle(self, body: bytes) -> AsyncIterator[bytes]:
        call = wire_router.decode_call(body)
        if isinstance(call, RouteNotify):
            self.notifications += len(call.events)
            for event in call.events:
                self.bookings.released(event.model, event.request_id, event.kind)
            return
        yield wire_router.encode(self.route(call))

    def route(self, request: RouteRequest) -> RouteAnswer:
        """Pick a worker and book the request on it (and tell the other replicas)."""
        model, rid = request.model, request.request_id
        service = self.models.get(model)
        if service is None:
            return self._refuse(
                model, "unknown_model", f"router {self.instance_id} knows no worker of {model!r}"
            )
        try:
            decision = service.router.pick(request.token_ids, rid, exclude=request.exclude)
        except AllWorkersBusy as exc:
            return self._refuse(model, "busy", str(exc))
        except RouterError as exc:
            return self._refuse(model, "no_workers", str(exc))
        record = service.instance(decision.worker_id)
        if record is None:  # left discovery between the decision and now
            service.router.on_finished(rid)
            return self._refuse(model, "no_workers", f"worker {decision.worker_id} just left")
        self.bookings.booked(model, rid)
        self.picks[model, "routed"] += 1
        return RouteReply(
            decision.worker_id, record.address, decision.overlap_blocks, decision.prompt_blocks
        )

    def _refuse(self, model: str, reason: RefusalReason, message: str) -> RouteRefused:
        self.picks[model, reason] += 1
        return RouteRefused(reason, message)
