"""Where the frontend's routing decisions are made, by name (``--router``):

* ``embedded``: one in-process :class:`RouterService` per model (:class:`EmbeddedPicker`);
* ``standalone``: ask the ``dynamoctl router`` replicas found in discovery
  (:mod:`dynamoctl.frontend.remote`).

Either way a model gets a :class:`~dynamoctl.frontend.models.ModelPicker`, so the
request pipeline (admission, migration) is the same, and either picker is a
:class:`~dynamoctl.frontend.picking.WorkerPicker`, disaggregation included: both keep a model's
prefill workers apart (:class:`~dynamoctl.router.pools.ModelPools`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.models import ModelPicker
from dynamoctl.frontend.picking import NoWorkerAvailable, PoolSurvey, WorkerChoice
from dynamoctl.frontend.remote import StandaloneRouting
from dynamoctl.router import AllWorkersBusy, KvRouter, RouterError
from dynamoctl.router.pools import ModelPools
from dynamoctl.router.settings import RouterSettings, check_mode
from dynamoctl.util.aio import AsyncService
from dynamoctl.util.registry import Registry
from dynamoctl.wire.engine import ModelCard
from dynamoctl.wire.router import RoutePool

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

    async def pick(self, token_ids: list[int], request_id: str, exclude: set[str]) -> WorkerChoice:
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

    async def survey(self, token_ids: list[int], request_id: str) -> PoolSurvey:
        pools = self.pools
        return PoolSurvey(pools.prefill_workers(), pools.decode_cached_tokens(token_ids))

    async def pick_prefill(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return self._pick("prefill", token_ids, request_id, exclude)

    def prefill_finished(self, request_id: str) -> None:
        self.pools.prefill.router.on_finished(request_id)

    async def pick_decode(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return self._pick("decode", token_ids, request_id, exclude)

    def _pick(
        self, pool: RoutePool, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        try:
            picked = self.pools.pick(pool, token_ids, request_id, exclude)
        except RouterError as exc:
            busy = isinstance(exc, AllWorkersBusy)
            raise NoWorkerAvailable(str(exc), busy=busy) from exc
        return WorkerChoice(picked.decision.worker_id, picked.record.address, picked.record.label)


class EmbeddedRouting(AsyncService):
    """A :class:`RouterService` per model, inside the frontend."""

    def __init__(self, discovery: Discovery, namespace: str, settings: RouterSettings) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.settings = settings

    async def close(self) -> None:
        """Each model's router is closed with its picker."""

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """None: the embedded router's decisions show in the frontend's own metrics."""

    async def make_picker(self, model: str, card: ModelCard) -> ModelPicker:
        def build() -> KvRouter:
            return KvRouter.from_settings(self.settings, card.block_size)

        return EmbeddedPicker(await ModelPools.open(self.discovery, self.namespace, model, build))


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
