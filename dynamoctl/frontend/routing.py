"""Where the frontend's routing decisions are made, by name (``--router``):

* ``embedded``: one in-process :class:`RouterService` per model (:class:`EmbeddedPicker`);
* ``standalone``: ask the ``dynamoctl router`` replicas found in discovery
  (:mod:`dynamoctl.frontend.remote`).

Either way a model gets a :class:`~dynamoctl.frontend.models.ModelPicker`, so the
request pipeline (admission, migration) is the same. Only the embedded picker is also a
:class:`~dynamoctl.frontend.disagg.PrefillPool` (disaggregation); the standalone routers
route to ``agg`` and ``decode`` workers only, so with them a disaggregated deployment
serves aggregated (decode workers prefill locally; docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.models import ModelPicker
from dynamoctl.frontend.picking import NoWorkerAvailable, WorkerChoice
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
    """Picks workers for one model with in-process routers: one over the ``agg`` and
    ``decode`` workers (every request ends there), one over the ``prefill`` workers
    (None: aggregated only)."""

    def __init__(self, service: RouterService, prefill: RouterService | None = None) -> None:
        self.service = service
        self.prefill = prefill
        self._disaggregated: tuple[tuple[int, int], bool] = ((-1, -1), False)

    async def pick(self, token_ids: list[int], request_id: str, exclude: set[str]) -> WorkerChoice:
        return _pick(self.service, token_ids, request_id, exclude, None)

    def first_token(self, request_id: str) -> None:
        self.service.router.on_first_token(request_id)

    def finished(self, request_id: str) -> None:
        self.service.router.on_finished(request_id)

    async def close(self) -> None:
        await self.service.close()
        if self.prefill is not None:
            await self.prefill.close()

    # -- PrefillPool (disaggregation) -------------------------------------------------

    def disaggregated(self) -> bool:
        # Asked for every request: recomputed only when either pool's workers change.
        service = self.service
        key = (service.generation, -1 if self.prefill is None else self.prefill.generation)
        if key != self._disaggregated[0]:
            answer = bool(self.prefill_workers()) or any(
                (record := service.instance(w)) is not None and record.role == "decode"
                for w in service.router.workers()
            )
            self._disaggregated = (key, answer)
        return self._disaggregated[1]

    def prefill_workers(self) -> int:
        return 0 if self.prefill is None else len(self.prefill.router.workers())

    def decode_cached_tokens(self, token_ids: list[int]) -> int:
        router = self.service.router
        return max(router.find_matches(token_ids).values(), default=0) * router.block_size

    async def pick_prefill(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        if self.prefill is None:
            raise NoWorkerAvailable("no prefill pool")
        return _pick(self.prefill, token_ids, request_id, exclude, None)

    def prefill_finished(self, request_id: str) -> None:
        if self.prefill is not None:
            self.prefill.router.on_finished(request_id)

    async def pick_decode(
        self, token_ids: list[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        return _pick(self.service, token_ids, request_id, exclude, 0.0, prefilled=True)


def _pick(
    service: RouterService,
    token_ids: list[int],
    request_id: str,
    exclude: set[str],
    overlap_weight: float | None,
    *,
    prefilled: bool = False,
) -> WorkerChoice:
    router = service.router
    try:
        decision = router.pick(
            token_ids,
            request_id,
            exclude=exclude,
            overlap_weight=overlap_weight,
            prefilled=prefilled,
        )
    except RouterError as exc:
        busy = isinstance(exc, AllWorkersBusy)
        raise NoWorkerAvailable(str(exc), busy=busy) from exc
    record = service.instance(decision.worker_id)
    if record is None:  # left discovery between the decision and now
        router.on_finished(request_id)
        raise NoWorkerAvailable(f"worker {decision.worker_id} just left")
    return WorkerChoice(decision.worker_id, record.address)


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
        def service(roles: tuple[str, ...]) -> RouterService:
            router = self.settings.build(card.block_size)
            return RouterService(self.discovery, self.namespace, model, router, roles=roles)

        main, prefill = service(("agg", "decode")), service(("prefill",))
        await main.start()
        await prefill.start()
        return EmbeddedPicker(main, prefill)


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
