"""Gang supervision: a multi-node replica lives, fails and stops as one instance.

A gang's leader (node rank 0) is an ordinary supervised instance with a life task,
probes, a backoff and a restart budget; its followers have none of their own
(docs/operations.md, "Multi-node replicas"):

- **Start together**: the followers are launched with the leader, every time; the
  engines' rendezvous orders them. Readiness is the leader's (it registers only once its
  engine has every rank).
- **Fail together**: the gang fails at the first of the leader's own failures (exit,
  hang, probe, start timeout) and any follower's exit. A stopped follower shows as the
  leader's hang (its steps stall, tokens stop), as NCCL makes it look. Then every member
  is stopped and the leader's life spends **one** unit of the budget and restarts them
  all.
- **Stop in order**: drain, scale-down and ``down`` stop the leader first (it
  deregisters and finishes in-flight requests), then the followers, which do not exit by
  themselves when their leader is gone (vLLM's headless followers block forever).
- **States**: each follower's state follows its leader's (:meth:`Gangs.mirror`), so
  ``status`` shows the whole gang; the reason is the leader's, prefixed with the gang.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from dynamoctl.launch.api import Launched, LaunchError, stop
from dynamoctl.supervisor.instance import Failure, Instance
from dynamoctl.supervisor.view import GangView
from dynamoctl.wire.states import STATE_TRANSITIONS, RestartReason, State

log = logging.getLogger(__name__)


class Gangs:
    """The followers of every gang leader in a supervisor, driven by the leader's life."""

    def __init__(self, deployment: GangView) -> None:
        self.deployment = deployment

    def followers(self, leader: Instance) -> list[Instance]:
        """``leader``'s followers in rank order ([] for a one-node instance or a follower)."""
        spec = leader.spec
        if not spec.gang or spec.rank:
            return []
        return sorted(
            (
                i
                for i in self.deployment.instances.values()
                if i.spec.gang == spec.gang and i.spec.rank and i.spec.pool == spec.pool
            ),
            key=lambda i: i.spec.rank,
        )

    def leader_of(self, inst: Instance) -> Instance:
        """The instance that leads ``inst``'s gang (``inst`` itself if it is no follower)."""
        if not inst.spec.rank:
            return inst
        return self.deployment.instances.get(inst.spec.gang, inst)

    def leaders(self, chosen: Iterable[Instance]) -> list[Instance]:
        """``chosen`` with followers replaced by their leaders, each once, in order."""
        return list({id(lead): lead for lead in map(self.leader_of, chosen)}.values())

    def mirror(self, leader: Instance, new: State, why: str) -> None:
        """Move the followers of ``leader`` to its new state, where their table allows."""
        for member in self.followers(leader):
            if new in STATE_TRANSITIONS[member.state] and member.state is not new:
                self.deployment.transition(member, new, f"gang {leader.spec.name}: {why}")

    async def launch(self, leader: Instance) -> Failure | None:
        """Start every follower of ``leader`` (adopted ones are kept); the failure if one
        cannot be started (then the ones that were are stopped again)."""
        members = [m for m in self.followers(leader) if not m.running]

        async def start(member: Instance) -> None:
            proc, member.adopted = member.adopted, None
            if proc is None:
                proc = await self.deployment.start_process(member.spec)
            member.proc, member.started_at = proc, time.monotonic()

        results = await asyncio.gather(*map(start, members), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            return None
        await self.stop(leader, grace=0.0)
        if not isinstance(errors[0], LaunchError):
            raise errors[0]
        return RestartReason.LAUNCH, f"gang member: {errors[0]}"

    async def watch(
        self, leader: Instance, watch: Coroutine[Any, Any, Failure | None]
    ) -> Failure | None:
        """The leader's own ``watch``, raced against its followers' processes: the first
        follower to end fails the gang (unless the gang is being stopped)."""
        members = [m for m in self.followers(leader) if m.proc is not None]
        if not members:
            return await watch
        own = asyncio.create_task(watch)
        ends = {asyncio.create_task(self._end_of(m)): m for m in members}
        try:
            done, _ = await asyncio.wait({own, *ends}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (own, *ends):
                if not task.done():
                    task.cancel()
            await asyncio.gather(own, *ends, return_exceptions=True)
        if own in done:
            return own.result()
        member = next(m for task, m in ends.items() if task in done)
        if not leader.wanted:
            return None
        return RestartReason.EXIT, (
            f"gang member {member.spec.name} on {member.spec.host} exited with status "
            f"{member.last_exit}"
        )

    @staticmethod
    async def _end_of(member: Instance) -> None:
        assert member.proc is not None
        member.last_exit = await member.proc.wait()

    async def stop(self, leader: Instance, grace: float) -> None:
        """Stop every running follower of ``leader`` (SIGTERM, ``grace``, SIGKILL), all at
        once; called once the leader's process has ended."""

        async def end(member: Instance, proc: Launched) -> None:
            member.last_exit = await stop(proc, grace)  # followers have no records

        running = [(m, m.proc) for m in self.followers(leader) if m.proc is not None]
        if running:
            log.info(
                "%s ended (status %s): stopping its followers %s",
                leader.spec.name,
                leader.last_exit,
                ", ".join(m.spec.name for m, _ in running),
            )
        await asyncio.gather(*(end(m, p) for m, p in running if p.returncode is None))
        for member, _ in running:
            member.proc = None

    def release(self, leader: Instance, give_back: Callable[[str], None]) -> None:
        """Give the whole nodes of ``leader``'s gang back (``give_back(host)``)."""
        for member in (leader, *self.followers(leader)):
            for host in member.spec.mpi_nodes or [member.spec.host]:  # an MPI world's all
                give_back(host)
            member.released = True
