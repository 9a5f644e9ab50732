"""A worker's LoRA adapters: it follows the adapters the supervisor asks for
(``{ns}/adapters/``, :class:`~dynamoctl.wire.adapters.AdapterSpec`), loads those of its
pool into its engine (:class:`~dynamoctl.engines.api.ServesAdapters`) and registers each
loaded one as a model of its own: a model card whose ``parent`` is the base model, and
its name in the instance record's ``adapters``, which makes the adapter's routers route
to this worker (docs/api.md, "LoRA adapters"). An adapter deleted there is deregistered
first (routers stop sending), then unloaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.engines.api import AdapterRefused, EngineError, ServesAdapters
from dynamoctl.wire.adapters import AdapterSpec
from dynamoctl.wire.engine import ModelCard

log = logging.getLogger(__name__)


class WorkerAdapters:
    """The adapters one worker instance holds, kept in step with the supervisor's wish."""

    def __init__(
        self,
        engine: ServesAdapters,
        discovery: Discovery,
        namespace: str,
        instance_id: str,
        role: str,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self.engine = engine
        self.discovery = discovery
        self.namespace = namespace
        self.instance_id = instance_id
        self.role = role
        self.on_change = on_change
        """Re-registers the instance record (its ``adapters`` changed)."""
        self.loaded: dict[str, AdapterSpec] = {}

    def card_key(self, name: str) -> str:
        return keys.model_key(self.namespace, name, self.instance_id)

    def card_keys(self) -> list[str]:
        """The model cards of the adapters held (what a drain deregisters)."""
        return [self.card_key(name) for name in self.loaded]

    async def follow(self, base: ModelCard) -> None:
        """Load and unload as the supervisor's adapters change, forever (cancel to stop)."""
        prefix = keys.adapters_prefix(self.namespace)
        async for event in self.discovery.watch(prefix):
            name = event.key[len(prefix) :]
            try:
                await self._apply(name, event.value if event.kind is EventKind.PUT else None,
                                  base)  # fmt: skip
            except Exception:  # one adapter's trouble must not stop following the others
                log.exception("[%s] LoRA adapter %s: could not apply", self.instance_id, name)

    async def _apply(self, name: str, value: bytes | None, base: ModelCard) -> None:
        if value is None:
            await self.unload(name)
            return
        spec = msgspec.json.decode(value, type=AdapterSpec)
        if self.role not in spec.pools:
            await self.unload(name)  # its pools changed: not ours any more
        elif self.loaded.get(name) != spec:
            await self.unload(name)  # a new path: load it again
            await self.load(spec, base)

    async def load(self, spec: AdapterSpec, base: ModelCard) -> bool:
        """Load ``spec`` and register it; a refusal is logged (``lora ls`` shows the
        worker missing from its holders) and answered False."""
        try:
            check_base_model(spec)
            await self.engine.load_adapter(spec.name, spec.path)
        except (AdapterRefused, EngineError, OSError, ValueError) as exc:
            log.error("[%s] LoRA adapter %s not loaded: %s", self.instance_id, spec.name, exc)
            return False
        self.loaded[spec.name] = spec
        card = msgspec.structs.replace(base, model=spec.name, parent=base.model)
        await self.discovery.register(self.card_key(spec.name), msgspec.json.encode(card))
        await self.on_change()
        log.info("[%s] LoRA adapter %s loaded from %s", self.instance_id, spec.name, spec.path)
        return True

    async def unload(self, name: str) -> None:
        if self.loaded.pop(name, None) is None:
            return
        await self.discovery.unregister(self.card_key(name))
        await self.on_change()
        await self.engine.unload_adapter(name)
        log.info("[%s] LoRA adapter %s unloaded", self.instance_id, name)


def check_base_model(spec: AdapterSpec) -> None:
    """A ``ValueError`` when ``spec`` names a base model its adapter was not trained on
    (its ``adapter_config.json``'s ``base_model_name_or_path``)."""
    if spec.base_model is None:
        return
    config = Path(spec.path) / "adapter_config.json"
    trained_on = json.loads(config.read_text()).get("base_model_name_or_path")
    if trained_on != spec.base_model:
        raise ValueError(
            f"{config} says base_model_name_or_path {trained_on!r}, the recipe's "
            f"base_model is {spec.base_model!r}"
        )
