"""Where the frontend's routing decisions are made, by name (``--router``):

* ``embedded``: one in-process :class:`RouterService` per model (:class:`EmbeddedPicker`);
* ``standalone``: ask the ``dynamoctl router`` replicas found in discovery
  (:mod:`dynamoctl.frontend.remote`).

Either way a model gets a :class:`~dynamoctl.frontend.models.ModelPicker`, so the
request pipeline (admission, migration) is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.generate import NoWorkerAvailable, WorkerChoice
from dynamoctl.frontend.models import ModelPicker
from dynamoctl.frontend.remote import StandaloneRouting
from dynamoctl.router import AllWorkersBusy, RouterError, RouterService
from dynamoctl.router.settings import RouterSettings, check_mode
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire.engine import ModelCard

__all__ = ["RouterSettings", "check_mode", "create_routing", "routing_names"]


class Routing(Protocol):
    """Builds each model's picker; started before the first and closed after the last."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def make_picker(self, model: str, card: ModelCard) -> ModelPicker: ...

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Add this routing's series to the frontend's ``/metrics``."""


class EmbeddedPicker:
    """Picks workers for one model with an in-process router."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    async def pick(self, token_ids: list[int], request_id: str, exclude: set[str]) -> WorkerChoice:
        try:
            decision = self.service.router.pick(token_ids, request_id, exclude=exclude)
        except RouterError as exc:
            busy = isinstance(exc, AllWorkersBusy)
            raise NoWorkerAvailable(str(exc), busy=busy) from exc
        record = self.service.instance(decision.worker_id)
        if record is None:  # left discovery between the decision and now
            self.service.router.on_finished(request_id)
            raise NoWorkerAvailable(f"worker {decision.worker_id} just left")
        return WorkerChoice(decision.worker_id, record.address)

    def first_token(self, request_id: str) -> None:
        self.service.router.on_first_token(request_id)

    def finished(self, request_id: str) -> None:
        self.service.router.on_finished(request_id)

    async def close(self) -> None:
        await self.service.close()


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
        router = self.settings.build(card.block_size)
        service = RouterService(self.discovery, self.namespace, model, router)
        await service.start()
        return EmbeddedPicker(service)


RoutingFactory = Callable[[Discovery, str, RouterSettings, float], Routing]
"""``(discovery, namespace, settings, route_timeout) -> Routing``."""

_ROUTINGS: dict[str, RoutingFactory] = {
    "embedded": lambda disc, ns, settings, _timeout: EmbeddedRouting(disc, ns, settings),
    "standalone": lambda disc, ns, _settings, timeout: StandaloneRouting(disc, ns, timeout),
}


def routing_names() -> list[str]:
    return list(_ROUTINGS)


def create_routing(
    name: str,
    discovery: Discovery,
    namespace: str,
    settings: RouterSettings,
    route_timeout: float = 1.0,
) -> Routing:
    """The routing called ``name``; ``ValueError`` naming the valid ones otherwise."""
    factory = _ROUTINGS.get(name)
    if factory is None:
        raise ValueError(f"unknown router {name!r}; valid: {', '.join(_ROUTINGS)}")
    return factory(discovery, namespace, settings, route_timeout)
