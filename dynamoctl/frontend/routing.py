"""The embedded router, as the frontend sees it: one :class:`RouterService` per model.

Adapts :class:`~dynamoctl.router.KvRouter`'s decisions to the frontend's
:class:`~dynamoctl.frontend.generate.WorkerPicker`: a worker id plus the request-plane
address from its discovery record, and router errors mapped to ``NoWorkerAvailable``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.generate import NoWorkerAvailable, WorkerChoice
from dynamoctl.frontend.models import ModelPicker, PickerFactory
from dynamoctl.router import AllWorkersBusy, KvRouter, RouterError, RouterService, mode_names
from dynamoctl.wire.engine import ModelCard


@dataclass(frozen=True)
class RouterSettings:
    """Routing knobs (recipe ``frontend.router``)."""

    mode: str = "kv"
    """Policy name; see ``dynamoctl.router.mode_names()``."""
    overlap_weight: float = 1.0
    """Alpha: weight of prefill cost against decode load."""
    temperature: float = 0.0
    """Softmax temperature over costs; 0 picks the cheapest."""
    busy_kv_usage: float | None = 0.95
    """A worker whose KV usage exceeds this is skipped; all busy → 503."""
    busy_waiting: int | None = None
    """A worker with more queued requests than this is skipped."""


def check_mode(mode: str) -> None:
    if mode not in mode_names():
        raise ValueError(f"unknown router mode {mode!r}; valid: {', '.join(mode_names())}")


class EmbeddedPicker:
    """Picks workers for one model with an in-process router."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    def pick(self, token_ids: list[int], request_id: str, exclude: set[str]) -> WorkerChoice:
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


def embedded_picker_factory(
    discovery: Discovery, namespace: str, settings: RouterSettings
) -> PickerFactory:
    async def make(model: str, card: ModelCard) -> ModelPicker:
        router = KvRouter(
            settings.mode,
            card.block_size,
            overlap_weight=settings.overlap_weight,
            temperature=settings.temperature,
            busy_kv_usage=settings.busy_kv_usage,
            busy_waiting=settings.busy_waiting,
        )
        service = RouterService(discovery, namespace, model, router)
        await service.start()
        return EmbeddedPicker(service)

    return make
