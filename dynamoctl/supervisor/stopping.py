"""Stopping an instance on purpose (drain, scale-down, ``down``): DRAINING, SIGTERM, the
grace, SIGKILL; STOPPED, spending no budget, its GPUs (a gang's: whole nodes) back to the
map. Each wait is bounded (:mod:`dynamoctl.supervisor.deadlines`): a supervision that does
not end once its process is stopped is given up, so ``down`` always finishes. The
supervisor hands it a :class:`~dynamoctl.supervisor.view.StopView`.
"""

from __future__ import annotations

import asyncio
import logging

from dynamoctl.launch.api import Launched, kill, stop
from dynamoctl.supervisor.deadlines import LIFE_END_S, abandon
from dynamoctl.supervisor.instance import Instance
from dynamoctl.supervisor.view import StopView
from dynamoctl.wire.states import State

log = logging.getLogger(__name__)

NOW_TIMEOUT = 3.0
"""Seconds ``down --now`` gives each instance between SIGTERM and SIGKILL."""


class Stops:
    """Stops the instances of one deployment on purpose."""

    def __init__(self, deployment: StopView) -> None:
        self.deployment = deployment

    async def stop_instance(self, inst: Instance, now: bool, why: str) -> None:
        """Stop ``inst`` on purpose: it ends STOPPED (FAILED if it had failed for good),
        spends no budget, and its GPUs go back to the map."""
        inst.stop_why = inst.stop_why or why
        inst.stop_asked.set()
        task = inst.task
        if task is None or task.done():  # never started, or its life is over
            if inst.adopted is not None:  # taken back, never watched: stopped all the same
                await stop(
                    inst.adopted, NOW_TIMEOUT if now else self.deployment.settings.drain_timeout
                )
                inst.adopted = None
            if inst.state is State.PENDING:
                self.stopped(inst, f"{why}: never started")
        else:
            if inst.proc is not None and inst.running:
                await self.drain(inst, inst.proc, NOW_TIMEOUT if now else None, why)
            # Its life task records STOPPED (and its followers'), within a bound: a life
            # stuck in an await must not hold up ``down``.
            if not (await asyncio.wait({task}, timeout=LIFE_END_S))[0]:
                await self._give_up(inst, task, why)
        self.release(inst)  # also when it had failed for good

    async def _give_up(self, inst: Instance, task: asyncio.Task[None], why: str) -> None:
        """A life task that did not end once its instance was asked to stop: cancelled,
        its process group killed, the instance recorded STOPPED (a supervisor bug, logged)."""
        log.error(
            "%s: its supervision did not end %g s after it was asked to stop (%s); "
            "killing its process group",
            inst.spec.name, LIFE_END_S, inst.state,
        )  # fmt: skip
        abandon(task)
        if inst.proc is not None and inst.running:
            inst.last_exit = await kill(inst.proc)
        await self.deployment.gangs.stop(inst, 0.0)
        if inst.state not in (State.STOPPED, State.FAILED):
            self.stopped(inst, f"{why}: given up")
        inst.ended.set()

    async def drain(self, inst: Instance, proc: Launched, grace: float | None, why: str) -> None:
        """SIGTERM, ``grace`` (default ``drain_timeout``), SIGKILL. Asking again (``down
        --now`` during a drain) shortens the grace."""
        if inst.state is not State.DRAINING:
            self.deployment.transition(inst, State.DRAINING, why)
        await stop(proc, self.deployment.settings.drain_timeout if grace is None else grace)

    def stopped(self, inst: Instance, why: str) -> None:
        """STOPPED, and its GPUs back to the map at once: a scale-up may follow as soon as
        ``status`` shows it."""
        self.deployment.transition(inst, State.STOPPED, why)
        self.release(inst)

    def release(self, inst: Instance) -> None:
        """Give a stopped instance's GPUs back for ``scale`` (once: the map may have handed
        them to another instance since)."""
        if inst.spec.gang and not inst.released:
            self.deployment.gangs.release(inst, self.deployment.gpu_map.release_node)  # whole nodes
        if inst.spec.gpus and not inst.released:
            self.deployment.gpu_map.release(inst.spec.host, inst.spec.gpus)
            inst.released = True
        self.deployment.capacity.check_release()  # an extra job with no node in use goes back
