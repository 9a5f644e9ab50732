"""Which models are served right now, with a tokenizer and a router each.

A model appears with its first worker's model card (the frontend loads its tokenizer and
starts a router for it, embedded or a client of the standalone routers) and disappears
with its last worker; :class:`~dynamoctl.router.models.ModelFollower` does the following.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from dynamoctl.discovery import Discovery
from dynamoctl.frontend.errors import adapter_not_loaded, model_not_found, model_unavailable
from dynamoctl.frontend.picking import WorkerPicker
from dynamoctl.router.models import ModelFollower
from dynamoctl.tokenizer import Tokenizer, load_tokenizer
from dynamoctl.util.aio import AsyncService
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


class ModelRegistry(AsyncService):
    """Follows model cards in discovery; :meth:`get` is what request handlers call."""

    def __init__(self, discovery: Discovery, namespace: str, make_picker: PickerFactory):
        self.make_picker = make_picker
        self._follower = ModelFollower(discovery, namespace, self._open, self._close)
        self._adapters: set[str] = set()
        """LoRA adapters ever served: one with no worker now is a 404, not a 503."""

    def get(self, name: str) -> ServedModel | None:
        return self._follower.get(name)

    def resolve(self, name: str) -> ServedModel:
        """The served model ``name``; else a 503 while a model once served has no worker
        (retry: not a typo), a 404 for a name never served."""
        model = self.get(name)
        if model is None:
            if name in self._adapters:  # unloaded on purpose (dynamoctl lora unload)
                raise adapter_not_loaded(name)
            if self.was_served(name):  # its workers are gone for now, or restarting
                raise model_unavailable(name)
            raise model_not_found(name, [m.name for m in self.models()])
        return model

    def was_served(self, name: str) -> bool:
        """Whether ``name`` had workers at some point since the frontend started (a 503
        while it has none, not a 404)."""
        return name in self._follower.known

    def models(self) -> list[ServedModel]:
        return [served for _, served in self._follower.items()]

    async def start(self) -> None:
        await self._follower.start()

    async def close(self) -> None:
        await self._follower.close()

    async def _open(self, name: str, card: ModelCard) -> ServedModel:
        source = card.tokenizer or BUILTIN_TOKENIZER
        tokenizer = await asyncio.to_thread(load_tokenizer, source)
        served = ServedModel(name, card, tokenizer, await self.make_picker(name, card))
        if card.parent is not None:
            self._adapters.add(name)
        log.info("model %s is served (tokenizer %s, block size %d)", name, source, card.block_size)
        return served

    @staticmethod
    async def _close(served: ServedModel) -> None:
        await served.picker.close()
