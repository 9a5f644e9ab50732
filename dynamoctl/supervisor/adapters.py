"""LoRA adapters through the supervisor (``dynamoctl lora load|unload|ls``): the adapters
a deployment serves are discovery values without a lease, ``{ns}/adapters/{name}``
(:class:`~dynamoctl.wire.adapters.AdapterSpec`), written here from the recipe at ``up``
and by the control endpoint at run time; each worker of the named pools follows them
(``worker/adapters.py``), so a restarted or added worker loads them too. Who holds what
is read back from the workers' instance records (their ``adapters``)."""

from __future__ import annotations

import msgspec

from dynamoctl.discovery import keys
from dynamoctl.discovery.api import Store
from dynamoctl.discovery.registry import store_from_url
from dynamoctl.recipe.lora import ADAPTER_NAME
from dynamoctl.recipe.models import Recipe
from dynamoctl.wire.adapters import AdapterHolders, AdapterSpec, LoraLoadRequest, LoraReport
from dynamoctl.wire.records import Component, InstanceRecord, decode_json


class AdapterControl:
    """The deployment's adapters in discovery; one store connection, opened on first use
    (a managed etcd starts after the supervisor)."""

    def __init__(self, recipe: Recipe, discovery_url: str, namespace: str) -> None:
        self.recipe = recipe
        self.discovery_url = discovery_url
        self.namespace = namespace
        self._store: Store | None = None

    def _open(self) -> Store:
        if self._store is None:
            self._store = store_from_url(self.discovery_url)
        return self._store

    def lora_pools(self) -> list[str]:
        """The pools whose recipe enables LoRA."""
        return [role for role, pool in self.recipe.workers.pools().items() if pool.lora]

    async def declare_recipe(self) -> None:
        """The recipe's adapters, each for the pools that declare it (at ``up``)."""
        pools: dict[str, list[str]] = {}
        specs: dict[str, AdapterSpec] = {}
        for role, pool in self.recipe.workers.pools().items():
            for adapter in pool.lora.adapters if pool.lora else []:
                pools.setdefault(adapter.name, []).append(role)
                specs[adapter.name] = AdapterSpec(
                    name=adapter.name, path=adapter.path, pools=[],
                    base_model=adapter.base_model,
                )  # fmt: skip
        for name, spec in specs.items():
            await self._put(msgspec.structs.replace(spec, pools=pools[name]))

    async def load(self, body: LoraLoadRequest) -> AdapterSpec:
        """Ask the pools' workers to load an adapter; ``ValueError`` for a bad name or a
        pool without LoRA."""
        if not ADAPTER_NAME.fullmatch(body.name):
            raise ValueError(f"adapter name {body.name!r}: use letters, digits, '.', '_', "
                             "':' or '-' (no '/')")  # fmt: skip
        enabled = self.lora_pools()
        pools = body.pools or enabled
        refused = [p for p in pools if p not in enabled]
        if refused or not pools:
            raise ValueError(
                f"pool(s) {', '.join(refused) or '(none)'} have no `lora` section in the "
                f"recipe (LoRA is on in: {', '.join(enabled) or 'no pool'})"
            )
        if body.name == self.recipe.model.name:
            raise ValueError(f"adapter name {body.name!r} is the base model's name")
        spec = AdapterSpec(name=body.name, path=body.path, pools=pools,
                           base_model=body.base_model)  # fmt: skip
        await self._put(spec)
        return spec

    async def unload(self, name: str) -> None:
        """Ask every worker to unload ``name``; ``KeyError`` if it is not served."""
        if not await self._open().delete(keys.adapter_key(self.namespace, name)):
            raise KeyError(f"no adapter {name!r} is loaded (dynamoctl lora ls)")

    async def report(self) -> LoraReport:
        stored = (await self._open().list(keys.namespace_prefix(self.namespace))).items
        prefix = keys.adapters_prefix(self.namespace)
        workers = keys.instances_prefix(self.namespace, Component.WORKER)
        holders: dict[str, list[str]] = {}
        for key, value in stored.items():
            if key.startswith(workers):
                try:
                    record = decode_json(value, InstanceRecord)
                except msgspec.DecodeError:
                    continue
                for name in record.adapters:
                    holders.setdefault(name, []).append(record.label or record.instance_id)
        out = []
        for key, value in sorted(stored.items()):
            if key.startswith(prefix):
                spec = msgspec.json.decode(value, type=AdapterSpec)
                out.append(AdapterHolders(spec=spec, workers=sorted(holders.get(spec.name, []))))
        return LoraReport(adapters=out)

    async def _put(self, spec: AdapterSpec) -> None:
        await self._open().put(keys.adapter_key(self.namespace, spec.name),
                               msgspec.json.encode(spec))  # fmt: skip

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()
