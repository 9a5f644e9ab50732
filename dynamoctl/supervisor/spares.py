"""Warm spares (recipe ``spares``; docs/operations.md, "Warm spares").

A spare is a replica of its pool started with ``--standby``: its engine starts and it is
probed like any worker, but it registers as standby (``{ns}/instances/standby/...``), which
routers and planners never read, and is ``STANDBY`` in ``status``. A spare's name is a
replica's name (``agg-2``); what makes it a spare is its command line
(:func:`~dynamoctl.supervisor.instance.as_spare`), so that ``state.json`` and an adopting
supervisor know it too.

Promotion writes the spare's promotion key in discovery (under a short lease: a request
nobody acted on vanishes); the worker registers as a worker and the instance is READY once
its worker record is seen: about a second, against a whole start. ``scale`` up promotes
spares before it starts anything, then starts new spares in the background; a replica that
fails while serving is replaced by a spare at once, and restarts as the spare itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import msgspec

from dynamoctl.discovery import keys, store_from_url
from dynamoctl.discovery.api import Store
from dynamoctl.plan.build import PlanError, place_replica
from dynamoctl.supervisor.instance import Instance, as_spare, free_indices
from dynamoctl.supervisor.view import SparesView
from dynamoctl.util.aio import BackgroundTasks
from dynamoctl.wire.records import Component, InstanceRecord
from dynamoctl.wire.start_phases import PROMOTE_TIMEOUT_S
from dynamoctl.wire.states import Phase, State

log = logging.getLogger(__name__)

PROMOTE_POLL = 0.02
"""Seconds between two looks for the promoted worker's record."""


class Spares:
    def __init__(self, deployment: SparesView) -> None:
        self.deployment = deployment
        self.promotions: Counter[str] = Counter()
        """Spares promoted, by why (``scale``, ``replace``), for ``/metrics``."""
        self._promoting: set[str] = set()
        self._store: Store | None = None
        self._background = BackgroundTasks()

    def wanted(self, pool: str) -> int:
        roles = self.deployment.recipe.workers.pools()
        return next((p.spares for r, p in roles.items() if r == pool), 0)

    def kept(self, pool: str) -> list[Instance]:
        """The pool's spares that are wanted, starting or on standby."""
        return [
            i
            for i in self.deployment.instances.values()
            if i.spec.pool == pool and i.standby and i.wanted and not i.spec.rank
        ]

    def on_standby(self, pool: str) -> list[Instance]:
        """The pool's spares ready to be promoted now (none already being promoted)."""
        return [
            i
            for i in sorted(self.kept(pool), key=lambda i: i.name)
            if i.state is State.STANDBY and i.spec.name not in self._promoting
        ]

    # -- keeping the count --------------------------------------------------------------

    def fill(self) -> list[str]:
        """Start the spares each pool is short of, at its lowest free indices; their names.
        No room left: logged, the deployment serves without them."""
        dep, started = self.deployment, list[str]()
        if dep.phase is not Phase.SERVING:
            return started
        for role, pool in dep.recipe.workers.pools().items():
            short = pool.spares - len(self.kept(role))
            if short <= 0:
                continue
            taken = [
                i.name.index
                for i in dep.instances.values()
                if i.spec.pool == role and (i.wanted or (i.task is not None and not i.task.done()))
            ]
            url, run_dir = dep.plan.discovery_url, dep.run_dir.path
            for index in free_indices(taken, short):
                try:
                    specs = place_replica(dep.recipe, role, index, dep.gpu_map, url, run_dir)
                except PlanError as exc:
                    log.warning("no room for a spare of %s: %s", role, exc)
                    break
                started.append(dep.begin([as_spare(specs[0], True), *specs[1:]]))
        if started:
            log.info("starting warm spare(s): %s", ", ".join(started))
            dep.save()
        return started

    # -- promotion ------------------------------------------------------------------------

    async def promote_for(self, pool: str, count: int) -> list[str]:
        """Promote up to ``count`` of the pool's spares at once (``scale`` up); the names
        promoted. ``scale`` then places what is still missing, and :meth:`fill` starts new
        spares after it, so that replicas get the room first."""
        chosen = self.on_standby(pool)[: max(count, 0)]
        done = await asyncio.gather(*(self.promote(i, "scale") for i in chosen))
        return [i.spec.name for i, ok in zip(chosen, done, strict=True) if ok]

    def replace(self, failed: Instance) -> None:
        """A replica failed while serving: a spare of its pool takes its place now, and
        ``failed`` restarts as the spare (the pool's count of each stays the same)."""
        if failed.spec.component != "worker" or failed.standby or failed.spec.rank:
            return
        if self.deployment.phase is not Phase.SERVING:
            return
        spares = self.on_standby(failed.spec.pool)
        if not spares:
            return
        spare = spares[0]
        self._promoting.add(spare.spec.name)  # claimed now: no second failure takes it
        failed.spec = as_spare(failed.spec, True)
        log.warning("%s failed: %s takes its place", failed.spec.name, spare.spec.name)
        self._background.spawn(self._take_place(failed, spare))

    async def _take_place(self, failed: Instance, spare: Instance) -> None:
        if not await self.promote(spare, "replace"):  # the failed one stays a replica
            failed.spec = as_spare(failed.spec, False)

    async def promote(self, inst: Instance, why: str) -> bool:
        """Ask ``inst``'s worker to join routing and wait until it has: READY. False when it
        could not (no standby record, or no worker record within :data:`PROMOTE_TIMEOUT_S`)."""
        dep, name = self.deployment, inst.spec.name
        self._promoting.add(name)
        inst.clock.promotion_asked = time.monotonic()
        try:
            store = self._store = self._store or store_from_url(dep.plan.discovery_url)
            ns = dep.plan.namespace
            ids = await self._labelled(store, Component.STANDBY, name)
            if not ids:
                log.warning("%s has no standby record: not promoted", name)
                return False
            lease = await store.grant(PROMOTE_TIMEOUT_S * 2)
            for iid in ids:
                await store.put(keys.promote_key(ns, iid), b"promote", lease)
            deadline = time.monotonic() + PROMOTE_TIMEOUT_S
            while len(await self._labelled(store, Component.WORKER, name)) < len(ids):
                if time.monotonic() > deadline or inst.state is not State.STANDBY:
                    log.warning("%s was not promoted within %g s", name, PROMOTE_TIMEOUT_S)
                    return False
                await asyncio.sleep(PROMOTE_POLL)
        finally:
            self._promoting.discard(name)
        if inst.state is not State.STANDBY or not inst.wanted:
            return False  # failed or asked to stop meanwhile: its life decides
        inst.spec = as_spare(inst.spec, False)  # a restart is a replica's now
        took = inst.clock.promoted()
        inst.ready_since = time.monotonic()
        dep.transition(inst, State.READY, f"promoted ({why}) in {took:.2f} s")
        self.promotions[why] += 1
        dep.save()
        return True

    async def _labelled(self, store: Store, component: str, label: str) -> list[str]:
        """Instance ids of the records of ``component`` named ``label`` (one per instance of
        the process)."""
        listing = await store.list(keys.instances_prefix(self.deployment.plan.namespace, component))
        ids = []
        for value in listing.items.values():
            try:
                record = msgspec.json.decode(value, type=InstanceRecord)
            except msgspec.DecodeError:
                continue
            if record.label == label:
                ids.append(record.instance_id)
        return ids

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        store, self._store = self._store, None
        if store is not None:
            await store.close()
