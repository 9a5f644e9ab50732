"""Which models are served right now: a live view of ``{ns}/models/`` in discovery.

A model appears with its first worker's model card (the frontend loads its tokenizer and
starts a router for it) and disappears with its last worker. Several models at once are
independent: each has its own tokenizer and router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.frontend.generate import WorkerPicker
from dynamoctl.tokenizer import Tokenizer, load_tokenizer
from dynamoctl.wire.engine import ModelCard

log = logging.getLogger(__name__)

BUILTIN_TOKENIZER = "builtin"


class ModelPicker(WorkerPicker, Protocol):
    """A router for one model, with a lifetime."""

    async def close(self) -> None: ...


PickerFactory = Callable[[str, ModelCard], Awaitable[ModelPicker]]
"""Builds the router for a model when it first appears: ``(model, card) -> picker``."""


@dataclass
class ServedModel:
    name: str
    card: ModelCard
    tokenizer: Tokenizer
    picker: ModelPicker
    created: int = field(default_factory=lambda: int(time.time()))
    instances: set[str] = field(default_factory=set)


class ModelRegistry:
    """Follows model cards in discovery; :meth:`get` is what request handlers call."""

    def __init__(self, discovery: Discovery, namespace: str, make_picker: PickerFactory):
        self.discovery = discovery
        self.namespace = namespace
        self.make_picker = make_picker
        self._models: dict[str, ServedModel] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, name: str) -> ServedModel | None:
        return self._models.get(name)

    def models(self) -> list[ServedModel]:
        return sorted(self._models.values(), key=lambda m: m.name)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="frontend-models")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        closing = [self._close_picker(m) for m in self._models.values()]
        self._models.clear()
        await asyncio.gather(*closing, *self._closing, return_exceptions=True)

    async def _follow(self) -> None:
        prefix = keys.models_prefix(self.namespace)
        async for event in self.discovery.watch(prefix):
            model_name, _, instance = event.key[len(prefix) :].rpartition("/")
            try:
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    await self._add(model_name, instance, event.value)
                else:
                    await self._remove(model_name, instance)
            except Exception:  # one bad card must not stop the frontend from following
                log.exception("could not apply model card %s", event.key)

    async def _add(self, name: str, instance: str, raw: bytes) -> None:
        served = self._models.get(name)
        if served is None:
            card = msgspec.json.decode(raw, type=ModelCard)
            source = card.tokenizer or BUILTIN_TOKENIZER
            tokenizer = await asyncio.to_thread(load_tokenizer, source)
            served = ServedModel(name, card, tokenizer, await self.make_picker(name, card))
            self._models[name] = served
            log.info(
                "model %s is served (tokenizer %s, block size %d)", name, source, card.block_size
            )
        served.instances.add(instance)

    async def _remove(self, name: str, instance: str) -> None:
        served = self._models.get(name)
        if served is None:
            return
        served.instances.discard(instance)
        if not served.instances:
            del self._models[name]
            log.info("model %s has no workers left", name)
            # Off the follow loop: a slow router shutdown must not delay the next card.
            task = asyncio.create_task(self._close_picker(served), name=f"close-router-{name}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_picker(served: ServedModel, timeout: float = 10.0) -> None:
        try:
            await asyncio.wait_for(served.picker.close(), timeout)
        except asyncio.TimeoutError:
            log.warning("router for %s did not close within %.0fs", served.name, timeout)
