"""``scale``: a pool's replicas added at the lowest free indices, placed (GPUs included) as
the plan places them, or the highest-numbered drained; past the allocation, in an extra
Slurm job when the recipe allows it (``growth.py``). A gang counts once."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from dynamoctl.plan.build import PlanError, place_replica
from dynamoctl.recipe.models import Role
from dynamoctl.supervisor.instance import InstanceName, free_indices
from dynamoctl.wire.control import ScaleReply

if TYPE_CHECKING:
    from dynamoctl.supervisor.supervisor import Supervisor


class Scaling:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def planned(self, pool: str) -> tuple[int, int] | None:
        """The planner's (fewest, most) replicas of ``pool``; None if no planner sizes it
        (none in the recipe, or ``drain planner-0`` stopped it)."""
        planner = self.sup.recipe.planner
        role = next((r for r in self.sup.recipe.workers.pools() if r == pool), None)
        running = any(
            i.spec.component == "planner" and i.wanted for i in self.sup.instances.values()
        )
        return planner.bounds(role) if planner and role and running else None

    async def scale(self, pool: str, replicas: int) -> ScaleReply:
        """Drain the highest-numbered replicas of ``pool``, or add replicas at the lowest
        free indices; what was drained, withdrawn (queued in an extra job), started and
        submitted."""
        sup = self.sup
        pools = sup.recipe.workers.pools()
        role = next((r for r in pools if r == pool), None)
        if role is None:
            raise KeyError(f"no worker pool {pool!r} (pools: {', '.join(pools)})")
        active = sorted(  # leaders: a gang counts once
            (
                i
                for i in sup.instances.values()
                if i.spec.pool == pool and i.wanted and not i.spec.rank
            ),
            key=lambda i: i.name,
        )
        waiting = sup.growth.waiting(role)  # replicas whose extra job is queued
        if replicas < len(active) + len(waiting):
            gone = sup.growth.withdraw(role, len(active) + len(waiting) - replicas)
            drained: list[str] = []
            for inst in active[replicas:]:
                drained += await sup.drain(inst.spec.name, "scale-down")
            withdrawn = [str(InstanceName(pool, index)) for index in gone]
            return ScaleReply(drained=drained, withdrawn=withdrawn)
        reply = ScaleReply()
        taken = [*(i.name.index for i in active), *waiting]
        for index in free_indices(taken, replicas - len(taken)):
            old = sup.instances.get(str(InstanceName(pool, index)))
            if old is not None and old.task is not None and not old.task.done():
                raise PlanError(f"{old.spec.name} is still stopping; try again when it is STOPPED")
            try:
                reply.started.append(self.add_replica(role, index))
            except PlanError as exc:  # the plan's words name the recipe field
                job = await sup.growth.defer(role, index, exc)  # or raises, saying why
                reply.started.append(str(InstanceName(pool, index)))
                reply.submitted += [job] if job else []
        sup.save()
        return reply

    def add_replica(self, role: Role, index: int) -> str:
        """Place replica ``index`` of ``role`` on what the GPU map has left and start its
        life; its name. PlanError when there is no room."""
        sup = self.sup
        url, run_dir = sup.plan.discovery_url, sup.run_dir.path
        specs = place_replica(sup.recipe, role, index, sup.gpu_map, url, run_dir)
        for spec in specs:
            sup.instances[spec.name] = sup.new_instance(spec)
        inst, spec = sup.instances[specs[0].name], specs[0]
        inst.task = asyncio.create_task(sup.life(inst), name=f"life-{spec.name}")
        return spec.name
