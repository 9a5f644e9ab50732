"""Which models a namespace serves right now: a live view of ``{ns}/models/`` in discovery.

Both the frontend (a tokenizer and a router per model) and ``dynamoctl router`` (a
router per model) need the same thing: build something for a model when its first
worker's card appears, and close it when its last worker's card goes. Several models at
once are independent. While discovery settles after an outage, cards that vanish are held
for about a lease TTL (their workers re-register meanwhile), so a model being served is
not closed because every lease expired at once (:mod:`dynamoctl.discovery.hold`); the
names of models ever served are kept, so that a model without workers is told apart from
one never served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import msgspec

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.util.aio import AsyncService, BackgroundTasks
from dynamoctl.wire.engine import ModelCard

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelFollower(AsyncService, Generic[T]):
    """Follows model cards in discovery; ``open(model, card)`` builds a model's value on
    its first card, ``close(value)`` runs (off the follow loop, bounded) after its last."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        open: Callable[[str, ModelCard], Awaitable[T]],
        close: Callable[[T], Awaitable[None]],
        *,
        close_timeout: float = 10.0,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self._open = open
        self._close = close
        self.close_timeout = close_timeout
        self._values: dict[str, T] = {}
        self._instances: dict[str, set[str]] = {}
        self.known: set[str] = set()
        """Every model that has been served since the start, with workers now or not."""
        self._task: asyncio.Task[None] | None = None
        self._closing = BackgroundTasks()

    def get(self, model: str) -> T | None:
        return self._values.get(model)

    def items(self) -> list[tuple[str, T]]:
        """Served models and their values, by name."""
        return sorted(self._values.items(), key=lambda item: item[0])

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="models-follow")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        closing = [self._bounded_close(m, v) for m, v in self._values.items()]
        self._values.clear()
        self._instances.clear()
        await asyncio.gather(*closing, *self._closing, return_exceptions=True)

    async def _follow(self) -> None:
        prefix = keys.models_prefix(self.namespace)
        async for event in self.discovery.watch(prefix, hold=True):
            model, _, instance = event.key[len(prefix) :].rpartition("/")
            try:
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    await self._add(model, instance, event.value)
                else:
                    self._remove(model, instance)
            except Exception:  # one bad card must not stop us from following the others
                log.exception("could not apply model card %s", event.key)

    async def _add(self, model: str, instance: str, raw: bytes) -> None:
        if model not in self._values:
            card = msgspec.json.decode(raw, type=ModelCard)
            self._values[model] = await self._open(model, card)
            self._instances[model] = set()
            self.known.add(model)
        self._instances[model].add(instance)

    def _remove(self, model: str, instance: str) -> None:
        instances = self._instances.get(model)
        if instances is None:
            return
        instances.discard(instance)
        if not instances:
            del self._instances[model]
            value = self._values.pop(model)
            log.info("model %s has no workers left", model)
            # Off the follow loop: a slow shutdown must not delay the next card.
            self._closing.spawn(self._bounded_close(model, value), name=f"close-{model}")

    async def _bounded_close(self, model: str, value: T) -> None:
        try:
            await asyncio.wait_for(self._close(value), self.close_timeout)
        except asyncio.TimeoutError:
            log.warning("%s did not close within %.0fs", model, self.close_timeout)
