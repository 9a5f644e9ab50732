"""Growing a Slurm deployment beyond its allocation, and giving the growth back: the Slurm
launcher's extra capacity (:mod:`dynamoctl.launch.capacity`).

When ``scale`` (an operator's or the planner's) asks for a replica the allocation has no
room for and the recipe allows it (``target.growth.max_jobs`` > 0), an extra job shaped as
the allocation is submitted. Once it runs, its nodes join the GPU map and the launcher runs
steps there in that job: the replicas waiting for it are placed and started like any other
(they register in discovery, are probed, restarted and drained the same way). When no
replica runs on an extra job's nodes any more (a scale-down drained them: the
highest-numbered replicas go first, and they are the ones placed last), its nodes leave
the map and the job is cancelled. ``down`` cancels what is left, after the teardown drained
it. The deployment is changed only through the supervisor's :class:`CapacityUser` port.
docs/operations.md, "Growing beyond the allocation".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.capacity import CapacityError, CapacityUser
from dynamoctl.launch.slurm.jobs import cancel, job_nodes, job_state, step_env, submit
from dynamoctl.launch.slurm.state import JobState
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SlurmTarget
from dynamoctl.settings import Role
from dynamoctl.wire.control import GrowthJob
from dynamoctl.wire.states import (
    GROWTH_TRANSITIONS,
    GrowthState,
    IllegalTransition,
    check_transition,
)

log = logging.getLogger(__name__)

HOLDER_SCRIPT = Path(__file__).with_name("growth.sh")
"""The extra job's batch script: holds its nodes while the deployment's job runs."""


async def submit_extra_job(
    target: SlurmTarget,
    parent_job: str,
    *,
    name: str,
    output: Path,
    drain_timeout: float,
    env: Mapping[str, str],
) -> str:
    """Submit one extra job of ``target.growth.nodes_per_job`` nodes, otherwise shaped as
    the allocation (partition, account, GPUs, time limit, extra arguments); its job id."""
    shape = target.model_copy(update={"nodes": target.growth.nodes_per_job})
    return await submit(
        shape,
        HOLDER_SCRIPT,
        [parent_job],
        job_name=f"dynamoctl-{name}-growth",
        output=output,
        drain_timeout=drain_timeout,
        env=env,
    )


POLL_S = 1.0
"""How often a queued or releasing job's state is read."""
RELEASE_TIMEOUT_S = 120.0
"""Seconds a cancelled job may take to leave the queue before it is reported FAILED."""
WATCH_S = 5.0
"""How often a running extra job is checked for having ended by itself."""


@dataclass
class ExtraJob:
    """One extra job and the replicas it is for."""

    job: str
    role: Role
    state: GrowthState = GrowthState.QUEUED
    nodes: list[str] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    """Indices of ``role`` replicas to start once it runs."""
    placed: list[str] = field(default_factory=list)
    message: str = ""


class ExtraJobs:
    """The extra jobs of one deployment (nothing happens unless the recipe allows it)."""

    def __init__(
        self,
        recipe: Recipe,
        target: SlurmTarget,
        user: CapacityUser,
        logs: Path,
        *,
        parent: str,
        routes: dict[str, str],
    ) -> None:
        self.recipe = recipe
        self.target = target
        self.settings = target.growth
        self.user = user
        """The deployment, as it may be changed."""
        self.logs = logs
        self.parent = parent
        """The deployment's own job, which extra jobs hold their nodes for."""
        self.routes = routes
        """The launcher's node -> extra job table: steps on a node run in its job."""
        self.jobs: list[ExtraJob] = []
        self._starting: set[asyncio.Task[None]] = set()
        """Jobs being waited for (cancelled at the end)."""
        self._releasing: set[asyncio.Task[None]] = set()
        """Jobs being cancelled (waited for at the end)."""

    def _capacity(self, role: Role) -> int:
        """Replicas of ``role`` that one extra job holds (0: it cannot hold one)."""
        pool = self.recipe.workers.pools()[role]
        nodes = self.settings.nodes_per_job
        if pool.nodes_per_replica > 1:
            return nodes // pool.nodes_per_replica
        if pool.gpus_per_replica == 0:
            return 0  # CPU replicas never run out of room: nothing to grow for
        return nodes * (self.target.gpus_per_node // pool.gpus_per_replica)

    def waiting(self, role: Role) -> list[int]:
        """Indices of ``role`` replicas waiting for a queued extra job."""
        queued = (j for j in self.jobs if j.role == role and j.state is GrowthState.QUEUED)
        return [i for job in queued for i in job.waiting]

    async def defer(self, role: Role, index: int, why: str) -> str | None:
        """Make room for replica ``index`` of ``role`` in an extra job: a queued one with
        room, else a new one (its id is returned). ``why`` (the allocation is full) is
        raised, with what growth would need, when growth is off or its budget spent."""
        if self.settings.max_jobs == 0:
            raise CapacityError(f"no free GPUs left for another {role} replica: {why}") from None
        capacity = self._capacity(role)
        if capacity == 0:
            raise CapacityError(
                f"no free GPUs left for another {role} replica: {why}; an extra job of "
                f"target.growth.nodes_per_job={self.settings.nodes_per_job} node(s) cannot "
                "hold one"
            ) from None
        for job in self.jobs:
            if job.state is GrowthState.QUEUED and job.role == role and len(job.waiting) < capacity:
                job.waiting.append(index)
                return None
        live = [j for j in self.jobs if j.state not in (GrowthState.RELEASED, GrowthState.FAILED)]
        if len(live) >= self.settings.max_jobs:
            raise CapacityError(
                f"no free GPUs left for another {role} replica: {why}; and the growth budget "
                f"is spent (target.growth.max_jobs={self.settings.max_jobs} extra job(s))"
            ) from None
        job = ExtraJob(await self._submit(), role, waiting=[index])
        self.jobs.append(job)
        log.info("allocation full: submitted extra Slurm job %s for %s", job.job, role)
        self._spawn(self._starting, self._bring_up(job))
        return job.job

    def withdraw(self, role: Role, count: int) -> list[int]:
        """Give up the ``count`` highest waiting ``role`` replicas (a scale-down before
        their job ran); a queued job left with none is cancelled."""
        gone = sorted(self.waiting(role), reverse=True)[:count]
        for job in self.jobs:
            if job.role != role or job.state is not GrowthState.QUEUED:
                continue
            job.waiting = [i for i in job.waiting if i not in gone]
            if not job.waiting:
                self._set(job, GrowthState.RELEASING, "not needed any more (scaled down)")
                self._spawn(self._releasing, self._release(job))
        return gone

    async def _submit(self) -> str:
        try:
            return await submit_extra_job(
                self.target,
                self.parent,
                name=self.recipe.name,
                output=self.logs / "growth-%j.log",
                drain_timeout=self.recipe.supervision.drain_timeout,
                env=step_env(os.environ),
            )
        except LaunchError as exc:
            raise CapacityError(f"growth: cannot submit an extra Slurm job: {exc}") from None

    async def _bring_up(self, job: ExtraJob) -> None:
        """Wait for ``job`` to run, add its nodes, start the replicas waiting for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.start_timeout
        try:
            while True:
                state = await job_state(job.job)
                if job.state is not GrowthState.QUEUED:
                    return  # withdrawn meanwhile
                if state is JobState.RUNNING:
                    break
                if state is None or state.ended:
                    raise LaunchError(f"ended before it ran ({state or 'gone'})")
                if loop.time() > deadline:
                    raise LaunchError(
                        f"still {state.value.lower()} after target.growth.start_timeout="
                        f"{self.settings.start_timeout:g} s"
                    )
                await asyncio.sleep(POLL_S)
            job.nodes = await job_nodes(job.job, step_env(os.environ))
            self._join(job)
        except (LaunchError, CapacityError) as exc:
            self._set(job, GrowthState.FAILED, str(exc))
            log.error("extra Slurm job %s failed: %s", job.job, exc)
            await self._cancel(job)
            return
        self._set(job, GrowthState.RUNNING, f"nodes {', '.join(job.nodes)}")
        for index in job.waiting:
            try:
                job.placed.append(self.user.place(job.role, index))
            except CapacityError as exc:
                job.message = str(exc)
                log.error("extra Slurm job %s: %s", job.job, exc)
        job.waiting = []
        self.user.save()
        self.check_release()  # nothing was placed on it: give it back
        await self._watch(job)

    async def _watch(self, job: ExtraJob) -> None:
        """While ``job`` runs, notice it ending by itself (its time limit, a node failure,
        an operator's scancel): its nodes leave, and its replicas, whose steps died with
        it, are stopped rather than restarted into a job that is gone."""
        while job.state is GrowthState.RUNNING:
            await asyncio.sleep(WATCH_S)
            try:
                state = await job_state(job.job)
            except LaunchError:
                continue  # squeue failed this time: ask again
            if job.state is GrowthState.RUNNING and (state is None or state.ended):
                await self._ended(job, state)

    async def check_host(self, host: str) -> None:
        """An instance on ``host`` failed: when ``host`` is a node of an extra job that has
        ended, act now rather than at the next watch, so its replicas are stopped instead
        of restarted into a job that is gone (their steps died with it)."""
        for job in self.jobs:
            if job.state is GrowthState.RUNNING and host in job.nodes:
                try:
                    state = await job_state(job.job)
                except LaunchError:
                    return  # squeue failed: the watch asks again
                if job.state is GrowthState.RUNNING and (state is None or state.ended):
                    await self._ended(job, state)
                return

    async def _ended(self, job: ExtraJob, state: JobState | None) -> None:
        self._leave(job)
        self._set(job, GrowthState.FAILED, f"ended by itself ({state or 'gone'})")
        log.error("extra Slurm job %s ended by itself: stopping its replicas", job.job)
        await self.user.stop_on(job.nodes, f"extra job {job.job} ended")

    def _join(self, job: ExtraJob) -> None:
        """The job's nodes become the deployment's: in the GPU map, reached through it."""
        self.user.add_nodes(job.nodes, self.target.addresses)
        for node in job.nodes:
            self.routes[node] = job.job

    def check_release(self) -> None:
        """Release every running extra job none of whose nodes runs a replica any more."""
        if not any(job.state is GrowthState.RUNNING for job in self.jobs):
            return
        occupied = self.user.occupied()
        for job in self.jobs:
            if job.state is GrowthState.RUNNING and not occupied & set(job.nodes):
                self._leave(job)
                self._set(job, GrowthState.RELEASING, "its replicas were drained")
                self._spawn(self._releasing, self._release(job))

    def _leave(self, job: ExtraJob) -> None:
        """The nodes leave the map first, so no replica is placed on a job being cancelled."""
        self.user.remove_nodes(job.nodes)
        for node in job.nodes:
            self.routes.pop(node, None)

    async def _release(self, job: ExtraJob) -> None:
        await self._cancel(job)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RELEASE_TIMEOUT_S
        with contextlib.suppress(LaunchError):
            while loop.time() < deadline:
                state = await job_state(job.job)
                if state is None or state.ended:
                    self._set(job, GrowthState.RELEASED, f"cancelled ({state or 'gone'})")
                    return
                await asyncio.sleep(POLL_S)
        self._set(
            job, GrowthState.FAILED, f"still in the queue {RELEASE_TIMEOUT_S:g} s after scancel"
        )

    async def _cancel(self, job: ExtraJob) -> None:
        try:
            await cancel(job.job, step_env(os.environ))
        except LaunchError as exc:
            log.error("scancel %s failed: %s", job.job, exc)

    def _set(self, job: ExtraJob, new: GrowthState, why: str) -> None:
        try:
            check_transition(GROWTH_TRANSITIONS, job.state, new, f"extra Slurm job {job.job}")
        except IllegalTransition as exc:
            log.error("%s; applied anyway (a supervisor bug)", exc)
        log.info("extra Slurm job %s: %s -> %s (%s)", job.job, job.state, new, why)
        job.state = new
        if new is GrowthState.FAILED:
            job.message = why
        self.user.changed()

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def close(self) -> None:
        """At the end of the deployment (its replicas were stopped): cancel every extra job
        still held, and wait for the releases under way."""
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        self.check_release()
        for job in self.jobs:
            if job.state is GrowthState.QUEUED:
                self._set(job, GrowthState.FAILED, "the deployment stopped first")
                await self._cancel(job)
        await asyncio.gather(*self._releasing, return_exceptions=True)

    def status(self) -> list[GrowthJob]:
        return [
            GrowthJob(
                job=job.job,
                state=job.state,
                nodes=list(job.nodes),
                replicas=job.placed + [f"{job.role}-{i}" for i in job.waiting],  # their names
                message=job.message,
            )
            for job in self.jobs
        ]
