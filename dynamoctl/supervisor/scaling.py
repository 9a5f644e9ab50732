"""``scale``: a pool's warm spares promoted first (``spares.py``), then replicas added at the
lowest free indices, placed (GPUs included) as
the plan places them, or the highest-numbered drained; past the deployment's own hosts, in
the launcher's extra capacity when it has some (:mod:`dynamoctl.launch.capacity`: the
Slurm launcher's extra jobs, when the recipe allows them). A gang counts once.

:class:`Scaling` is also the deployment as extra capacity may change it (its
:class:`~dynamoctl.launch.capacity.CapacityUser`): nodes join and leave the GPU map,
replicas are placed on them and drained off them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from dynamoctl.launch.capacity import CapacityError
from dynamoctl.plan.build import PlanError, place_replica
from dynamoctl.plan.hosts import HostError, resolve_host
from dynamoctl.recipe.models import Role
from dynamoctl.supervisor.instance import InstanceName, free_indices
from dynamoctl.supervisor.view import ScalingView
from dynamoctl.wire.control import ScaleReply


class Scaling:
    def __init__(self, deployment: ScalingView) -> None:
        self.deployment = deployment

    def planned(self, pool: str) -> tuple[int, int] | None:
        """The planner's (fewest, most) replicas of ``pool``; None if no planner sizes it
        (none in the recipe, or ``drain planner-0`` stopped it)."""
        recipe = self.deployment.recipe
        planner = recipe.planner
        role = next((r for r in recipe.workers.pools() if r == pool), None)
        running = any(
            i.spec.component == "planner" and i.wanted for i in self.deployment.instances.values()
        )
        return planner.bounds(role) if planner and role and running else None

    async def scale(self, pool: str, replicas: int) -> ScaleReply:
        """Drain the highest-numbered replicas of ``pool``, or add replicas at the lowest
        free indices; what was drained, withdrawn (waiting for extra capacity), started and
        submitted."""
        dep = self.deployment
        pools = dep.recipe.workers.pools()
        role = next((r for r in pools if r == pool), None)
        if role is None:
            raise KeyError(f"no worker pool {pool!r} (pools: {', '.join(pools)})")
        active = sorted(  # leaders: a gang counts once
            (
                i
                for i in dep.instances.values()
                if i.spec.pool == pool and i.wanted and not i.spec.rank and not i.standby
            ),
            key=lambda i: i.name,
        )
        waiting = dep.capacity.waiting(role)  # replicas whose extra room is on its way
        if replicas < len(active) + len(waiting):
            gone = dep.capacity.withdraw(role, len(active) + len(waiting) - replicas)
            drained: list[str] = []
            for inst in active[replicas:]:
                drained += await dep.drain(inst.spec.name, "scale-down")
            withdrawn = [str(InstanceName(pool, index)) for index in gone]
            return ScaleReply(drained=drained, withdrawn=withdrawn)
        # Warm spares first: a promotion is READY in about a second, a start in minutes.
        need = replicas - len(active) - len(waiting)
        reply = ScaleReply(started=await dep.spares.promote_for(pool, need))
        promoted = [dep.instances[name] for name in reply.started]
        taken = [*(i.name.index for i in [*active, *promoted]), *waiting]
        spares = [i.name.index for i in dep.spares.kept(pool)]
        for index in free_indices([*taken, *spares], replicas - len(taken)):
            old = dep.instances.get(str(InstanceName(pool, index)))
            if old is not None and old.task is not None and not old.task.done():
                raise PlanError(f"{old.spec.name} is still stopping; try again when it is STOPPED")
            try:
                reply.started.append(self.add_replica(role, index))
            except PlanError as exc:  # the plan's words name the recipe field
                try:
                    job = await dep.capacity.defer(role, index, str(exc))
                except CapacityError as no_room:  # saying why
                    raise PlanError(str(no_room)) from None
                reply.started.append(str(InstanceName(pool, index)))
                reply.submitted += [job] if job else []
        dep.spares.fill()  # the promoted spares' successors, once the replicas have room
        dep.save()
        return reply

    def add_replica(self, role: Role, index: int) -> str:
        """Place replica ``index`` of ``role`` on what the GPU map has left and start its
        life; its name. PlanError when there is no room."""
        dep = self.deployment
        url, run_dir = dep.plan.discovery_url, dep.run_dir.path
        return dep.begin(place_replica(dep.recipe, role, index, dep.gpu_map, url, run_dir))

    # -- the deployment as extra capacity changes it (CapacityUser) ---------------------

    def place(self, role: Role, index: int) -> str:
        try:
            return self.add_replica(role, index)
        except PlanError as exc:
            raise CapacityError(str(exc)) from None

    def add_nodes(self, nodes: Sequence[str], addresses: Mapping[str, str]) -> None:
        try:
            hosts = [resolve_host(n, addresses, field="growth job node", spans=True) for n in nodes]
        except HostError as exc:
            raise CapacityError(str(exc)) from None
        self.deployment.gpu_map.add_hosts(hosts)

    def remove_nodes(self, nodes: Sequence[str]) -> None:
        self.deployment.gpu_map.remove_hosts(list(nodes))

    def occupied(self) -> set[str]:
        return {
            inst.spec.host
            for inst in self.deployment.instances.values()
            if inst.wanted or (inst.task is not None and not inst.task.done())
        }

    async def stop_on(self, nodes: Collection[str], why: str) -> None:
        dep = self.deployment
        for inst in dep.gangs.leaders(dep.instances.values()):
            if inst.wanted and inst.spec.host in nodes:
                await dep.drain(inst.spec.name, why)

    def changed(self) -> None:
        self.deployment.changed()

    def save(self) -> None:
        self.deployment.save()
