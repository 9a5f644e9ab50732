"""Where the frontend's routing decisions are made, by name (``--router``):

* ``embedded``: one in-process :class:`RouterService` per model (:class:`EmbeddedPicker`);
* ``standalone``: ask the ``dynamoctl router`` replicas found in discovery
  (:mod:`dynamoctl.frontend.remote`).

Embedded routers of several frontend processes (``frontend.processes`` > 1, frontends on
several hosts) share their bookings (``--share-bookings``, :class:`SharedPicker`), as
router replicas do (:mod:`dynamoctl.router.standalone.bookings`): each publishes what it
books and applies the others', so N routers decide as one would. One frontend keeps the
plain :class:`EmbeddedPicker`: its request path pays nothing for the sharing.

Either way a model gets a :class:`~dynamoctl.frontend.models.ModelPicker`, so the
request pipeline (admission, migration) is the same, and either picker is a
:class:`~dynamoctl.frontend.picking.WorkerPicker`, disaggregation included: both keep a model's
prefill workers apart (:class:`~dynamoctl.router.pools.ModelPools`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.models import ModelPicker
from dynamoctl.frontend.picking import NoWorkerAvailable, PoolSurvey, WorkerChoice
from dynamoctl.frontend.remote import StandaloneRouting
from dynamoctl.frontend.tenants.service import current_headroom
from dynamoctl.router import AllWorkersBusy, KvRouter, RouterError
from dynamoctl.router.pools import ModelPools, booking_pool
from dynamoctl.router.settings import RouterSettings, check_mode
from dynamoctl.router.standalone.bookings import BookingSync
from dynamoctl.util.aio import AsyncService
from dynamoctl.util.registry import Registry
from dynamoctl.wire.engine import ModelCard
from dynamoctl.wire.records import Component
from dynamoctl.wire.router import BookingPool, RoutePool

__all__ = ["RouterSettings", "check_mode", "create_routing", "routing_names"]


class Routing(Protocol):
    """Builds each model's picker; started before the first and closed after the last."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def make_picker(self, model: str, card: ModelCard) -> ModelPicker: ...

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Add this routing's series to the frontend's ``/metrics``."""


class EmbeddedPicker:
    """Picks workers for one model with in-process routers (:class:`ModelPools`)."""

    def __init__(self, pools: ModelPools) -> None:
        self.pools = pools

    async def pick(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return self._pick("default", token_ids, request_id, exclude)

    def first_token(self, request_id: str) -> None:
        self.pools.main.router.on_first_token(request_id)

    def finished(self, request_id: str) -> None:
        self.pools.main.router.on_finished(request_id)

    async def close(self) -> None:
        await self.pools.close()

    # -- disaggregation -------------------------------------------------

    def disaggregated(self) -> bool:
        return self.pools.disaggregated()

    async def survey(self, token_ids: Sequence[int], request_id: str) -> PoolSurvey:
        pools = self.pools
        return PoolSurvey(pools.prefill_workers(), pools.decode_cached_tokens(token_ids))

    async def pick_prefill(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return self._pick("prefill", token_ids, request_id, exclude)

    def prefill_finished(self, request_id: str) -> None:
        self.pools.prefill.router.on_finished(request_id)

    async def pick_decode(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return self._pick("decode", token_ids, request_id, exclude)

    def _pick(
        self, pool: RoutePool, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        try:
            picked = self.pools.pick(pool, token_ids, request_id, exclude, current_headroom())
        except RouterError as exc:
            busy = isinstance(exc, AllWorkersBusy)
            raise NoWorkerAvailable(str(exc), busy=busy) from exc
        return WorkerChoice(picked.decision.worker_id, picked.record.address, picked.record.label)


class SharedPicker(EmbeddedPicker):
    """An :class:`EmbeddedPicker` whose bookings the other frontend processes see."""

    def __init__(self, pools: ModelPools, model: str, bookings: BookingSync) -> None:
        super().__init__(pools)
        self.model = model
        self.bookings = bookings

    def first_token(self, request_id: str) -> None:
        self.bookings.released(self.model, request_id, "first_token")

    def finished(self, request_id: str) -> None:
        self.bookings.released(self.model, request_id, "finished")

    def prefill_finished(self, request_id: str) -> None:
        self.bookings.released(self.model, request_id, "finished", "prefill")

    def _pick(
        self, pool: RoutePool, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        choice = super()._pick(pool, token_ids, request_id, exclude)
        self.bookings.booked(self.model, request_id, booking_pool(pool))
        return choice


class EmbeddedRouting(AsyncService):
    """A :class:`RouterService` per model, inside the frontend; with :meth:`share_bookings`,
    its bookings shared with the namespace's other frontends."""

    def __init__(self, discovery: Discovery, namespace: str, settings: RouterSettings) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.settings = settings
        self.bookings: BookingSync | None = None
        """The bookings stream shared with the other frontends; None: not shared."""
        self._pools: dict[str, ModelPools] = {}

    def share_bookings(self, instance_id: str, host: str) -> None:
        """Publish this frontend's bookings (on ``host``) and apply the other frontends';
        before :meth:`start`."""
        self.bookings = BookingSync(
            self.discovery, self.namespace, instance_id, self._router, host=host,
            component=Component.FRONTEND,
        )  # fmt: skip

    def _router(self, model: str, pool: BookingPool) -> KvRouter | None:
        pools = self._pools.get(model)
        return None if pools is None else pools.router(pool)

    async def start(self) -> None:
        if self.bookings is not None:
            await self.bookings.start()
            await self.bookings.register()

    async def close(self) -> None:
        """Each model's router is closed with its picker; the bookings stream here."""
        if self.bookings is not None:
            await self.bookings.close()

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The other frontends' bookings applied here, when shared (the embedded router's
        decisions show in the frontend's own metrics)."""
        bookings = self.bookings
        if bookings is not None:
            Gauge(
                "dynamoctl_frontend_peer_bookings",
                "Requests the other frontend processes booked, in this one's router.",
                registry=registry,
            ).set_function(bookings.peer_total)

    async def make_picker(self, model: str, card: ModelCard) -> ModelPicker:
        def build() -> KvRouter:
            return KvRouter.from_settings(self.settings, card.block_size, card.adapter)

        pools = await ModelPools.open(self.discovery, self.namespace, model, build)
        self._pools[model] = pools
        if self.bookings is None:
            return EmbeddedPicker(pools)
        return SharedPicker(pools, model, self.bookings)


RoutingFactory = Callable[[Discovery, str, RouterSettings, float], Routing]
"""``(discovery, namespace, settings, route_timeout) -> Routing``."""

ROUTINGS: Registry[RoutingFactory] = Registry("router", ValueError)
"""Where a frontend's routing decisions are made (``--router``)."""
ROUTINGS.add("embedded", lambda disc, ns, settings, _timeout: EmbeddedRouting(disc, ns, settings))
ROUTINGS.add(
    "standalone", lambda disc, ns, _settings, timeout: StandaloneRouting(disc, ns, timeout)
)


def routing_names() -> list[str]:
    return ROUTINGS.names()


def create_routing(
    name: str,
    discovery: Discovery,
    namespace: str,
    settings: RouterSettings,
    route_timeout: float = 1.0,
) -> Routing:
    """The routing called ``name``; ``ValueError`` naming the valid ones otherwise."""
    return ROUTINGS[name](discovery, namespace, settings, route_timeout)
