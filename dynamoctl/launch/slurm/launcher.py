"""The Slurm launcher: inside an allocation, each instance is one ``srun`` job step.

The supervisor runs inside the allocation (``sbatch slurm/launch.sh``) and starts every
instance as ``srun --jobid=JOB --nodes=1 --ntasks=1 --nodelist=NODE --overlap ...`` in a
session of its own on its own host (a TensorRT-LLM gang, one MPI world, as one step over
all its nodes: ``--nodes=N --ntasks-per-node=G --mpi=pmix``); that srun is the local
handle (pid, pgid) and the step (``JOBID.STEPID``) is the remote one. Signals go through
``scancel --signal`` to the step, not to srun: srun answers SIGINT with a status line and
SIGKILL to srun alone leaves the tasks running. The keeper inside the step (one per
task) watches its stdin, which srun forwards from a pipe this process holds, so an
instance stops when its supervisor dies even if the job goes on; when the job ends Slurm
ends its steps. Components stay children of their step (no ``--setsid``): with
no-cgroup process tracking a detached process escapes ``scancel``.

Jobs as a whole (``sbatch``, ``squeue``, ``scancel`` of a job, the login-node path) are
:mod:`dynamoctl.launch.slurm.jobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynamoctl.launch import hostcheck
from dynamoctl.launch.api import (
    InstanceSpec,
    LaunchError,
    ProcessRecord,
    path_unusable,
    port_in_use,
    read_secrets,
)
from dynamoctl.launch.capacity import CapacityUser, ExtraCapacity, NoExtraCapacity
from dynamoctl.launch.gpus import check_gpus
from dynamoctl.launch.local import keeper_argv
from dynamoctl.launch.slurm.growth import ExtraJobs
from dynamoctl.launch.slurm.jobs import (
    client_output,
    job_nodes,
    run_client,
    step_env,
)
from dynamoctl.launch.slurm.sbcast import stage_allocation
from dynamoctl.launch.weights import Ahead, ahead
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SlurmContainer, SlurmTarget

STEP_PREFIX = "dynamoctl:"
"""Job-step names are ``dynamoctl:INSTANCE``: how ``start`` finds the step it made."""

log = logging.getLogger(__name__)
KILL_FALLBACK_S = 10.0
"""After ``scancel --signal=KILL``, srun gets this long to notice before it is killed."""


def instance_env(spec: InstanceSpec) -> dict[str, str]:
    """The variables set inside the step; ``CUDA_VISIBLE_DEVICES`` from ``gpus`` if unset."""
    env = dict(spec.env)
    if spec.gpus and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in spec.gpus)
    return env


async def list_steps(job_id: str, env: Mapping[str, str]) -> dict[str, str]:
    """The job's live steps: ``{"JOBID.STEPID": name}`` (empty once the job is gone)."""
    argv = ["squeue", "--steps", f"--jobs={job_id}", "-h", "-o", "%i %j"]
    out = await client_output(argv, env, gone_ok=True)
    steps = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition(" ")
        if step:
            steps[step] = name
    return steps


async def scancel_step(step: str, sig: int, env: Mapping[str, str]) -> bool:
    """Send ``sig`` to every process of the step; False if it failed (or the step is gone)."""
    name = signal.Signals(sig).name.removeprefix("SIG")
    code, _, _ = await run_client(["scancel", f"--signal={name}", step], env)
    return code == 0


async def kill_strays(job: str, name: str, before: set[str], env: Mapping[str, str]) -> None:
    """SIGKILL every live step of ``job`` named ``name`` that is not in ``before``: steps
    whose srun is gone. Slurm keeps such a step's tasks running (the keeper's stdin, which
    slurmstepd relays from srun, never closes), holding the GPUs and ports a restart needs."""
    for step, step_name in (await list_steps(job, env)).items():
        if step_name == name and step not in before:
            log.warning("step %s (%s) outlived its srun: killing it", step, name)
            await scancel_step(step, signal.SIGKILL, env)


class SlurmStep:
    """A running ``srun`` (local, own session) and the job step it made (remote)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, record: ProcessRecord, env: Mapping[str, str]
    ) -> None:
        self._proc = proc
        self._env = env
        self.record = record
        self._step_ended: asyncio.Future[None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        """srun's status, once srun has ended and its step with it (killed if srun was
        killed alone: an OOM kill, a stray SIGKILL)."""
        code = await self._proc.wait()
        if self._step_ended is None:
            self._step_ended = asyncio.ensure_future(self._kill_step_left())
        await asyncio.shield(self._step_ended)
        return code

    async def _kill_step_left(self) -> None:
        step = self.record.step
        try:
            if step is None or step not in await list_steps(step.partition(".")[0], self._env):
                return
        except LaunchError as exc:  # squeue failed: the job's end ends the step anyway
            log.warning("cannot tell whether step %s outlived its srun: %s", step, exc)
            return
        code = self._proc.returncode
        log.warning("step %s outlived its srun (status %s): killing it", step, code)
        await scancel_step(step, signal.SIGKILL, self._env)

    async def signal(self, sig: int) -> None:
        if self._proc.returncode is not None:
            return
        step = self.record.step
        if step is None or not await scancel_step(step, sig, self._env):
            self._signal_srun(sig)  # no step, or the controller did not take it: best effort
        elif sig == signal.SIGKILL:
            # The tasks are dead once slurmd acts; srun follows, unless it cannot hear.
            asyncio.get_running_loop().call_later(
                KILL_FALLBACK_S, self._signal_srun, signal.SIGKILL
            )

    def _signal_srun(self, sig: int) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.record.pgid, sig)


class SlurmLauncher:
    """Runs every instance as a job step of one allocation.

    ``job_id`` defaults to ``$SLURM_JOB_ID``; ``python`` is the interpreter that runs the
    keeper on the nodes (default: this one, or ``python3`` inside a ``container``);
    ``env`` is the environment srun and the Slurm clients run with (default:
    ``os.environ``), minus :data:`~dynamoctl.launch.slurm.jobs.STRIPPED_ENV`; ``mpi`` is
    the MPI plugin of a TensorRT-LLM gang's step (``target.mpi``).
    """

    kind = "slurm"

    def __init__(
        self,
        *,
        job_id: str | None = None,
        python: str | None = None,
        container: SlurmContainer | None = None,
        env: Mapping[str, str] | None = None,
        step_timeout: float = 60.0,
        mpi: str = "pmix",
        stage_ahead: Ahead | None = None,
    ) -> None:
        self.mpi = mpi
        self.stage_ahead = stage_ahead
        """Model directories sbcast to every node's cache before anything starts, and the
        cache (recipe ``model.cache.stage_ahead``; :mod:`~dynamoctl.launch.slurm.sbcast`)."""
        self._env = step_env(os.environ if env is None else env)
        self.job_id = job_id or (os.environ if env is None else env).get("SLURM_JOB_ID")
        self.python = python or ("python3" if container else sys.executable)
        self.container = container
        self.step_timeout = step_timeout
        self.extra_jobs: dict[str, str] = {}
        """Node → the extra job (``target.growth``) holding it: steps there run in that
        job; every other node's in ``job_id``'s."""

    def extra_capacity(self, recipe: Recipe, user: CapacityUser, logs: Path) -> ExtraCapacity:
        """Extra jobs beyond the allocation (recipe ``target.growth``): steps on their
        nodes run in them (:attr:`extra_jobs`)."""
        if not isinstance(recipe.target, SlurmTarget):
            return NoExtraCapacity()
        parent = self.job_id or ""
        return ExtraJobs(recipe, recipe.target, user, logs, parent=parent, routes=self.extra_jobs)

    def _job(self) -> str:
        if not self.job_id:
            raise LaunchError(
                "not inside a Slurm allocation (SLURM_JOB_ID is not set): "
                "submit with `sbatch slurm/launch.sh RECIPE`, or run under salloc"
            )
        return self.job_id

    def _job_of(self, host: str) -> str:
        return self.extra_jobs.get(host) or self._job()

    async def allocation_nodes(self) -> list[str]:
        """Host names of the allocation's nodes."""
        return await job_nodes(self._job(), self._env)

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        if shutil.which("srun", path=self._env.get("PATH")) is None:
            raise LaunchError("srun is not on PATH: install the Slurm client commands")
        nodes = await self.allocation_nodes()
        for spec in instances:
            for host in spec.mpi_nodes or [spec.host]:
                if host not in nodes:
                    raise LaunchError(
                        f"{spec.name}: host {host!r} is not a node of Slurm job "
                        f"{self.job_id} (its nodes: {', '.join(nodes)})"
                    )
        worlds = [spec for spec in instances if spec.mpi_nodes]
        if worlds:
            await self._check_mpi(worlds[0])
        for result in await self._check_nodes(nodes, instances):
            node = result["host"]
            fix = "submit the job with --gpus-per-node (dynamoctl up on a login node does)"
            check_gpus(node, int(result["gpus"]), instances, "target.gpus_per_node", fix)
            for spec in (s for s in instances if s.host == node):
                for purpose, port in spec.ports.items():
                    if str(port) in result["busy"]:
                        raise port_in_use(spec, purpose, port, result["busy"][str(port)])
                error = path_unusable(spec, result.get("paths", {}))
                if error is not None:
                    raise error
        if self.stage_ahead is not None and self.stage_ahead.sources and instances:
            step_args = [*self._container_args(), self.python]
            report = await stage_allocation(
                self._job(),
                nodes,
                self.stage_ahead.sources,
                self.stage_ahead.settings,
                env=self._env,
                step_args=step_args,
            )
            log.info("model staged ahead on every node: %s", json.dumps(report))

    async def _check_nodes(
        self, nodes: list[str], instances: list[InstanceSpec]
    ) -> list[dict[str, Any]]:
        """:mod:`~dynamoctl.launch.hostcheck` on every node, in one step of one task each."""
        ports = {
            node: sorted({p for s in instances if s.host == node for p in s.ports.values()})
            for node in nodes
        }
        paths = {
            node: sorted({p for s in instances if s.host == node for p in s.paths.values()})
            for node in nodes
        }
        argv = [
            "srun",
            f"--jobid={self._job()}",
            f"--nodes={len(nodes)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}",
            "--overlap",
            "--export=ALL",
            f"--job-name={STEP_PREFIX}hostcheck",
            *self._container_args(),
            self.python,
            "-m",
            "dynamoctl.launch.hostcheck",
            "",
            json.dumps(ports),
            json.dumps(paths),
        ]
        code, out, err = await run_client(argv, self._env)
        results = hostcheck.parse(out)
        if {r["host"] for r in results} != set(nodes):
            raise LaunchError(
                f"{self.python} -m dynamoctl.launch.hostcheck did not run on every node of "
                f"Slurm job {self.job_id} (exit {code}): {err.strip()[-500:]}; is dynamoctl "
                "installed where the nodes' python finds it?"
            )
        return results

    async def _check_mpi(self, spec: InstanceSpec) -> None:
        """An MPI world needs Slurm's PMIx plugin *and* the PMIx library on the nodes: a
        one-task ``--mpi=pmix`` step on its first node shows whether both are there (the
        plugin alone is listed by ``srun --mpi=list`` even when the library is missing)."""
        argv = [
            "srun",
            f"--jobid={self._job()}",
            *("--nodes=1", "--ntasks=1", f"--nodelist={spec.mpi_nodes[0]}"),
            *("--overlap", f"--mpi={self.mpi}", f"--job-name={STEP_PREFIX}mpicheck"),
            *self._container_args(),
            "true",
        ]
        code, _, err = await run_client(argv, self._env)
        if code != 0:
            why = err.strip().splitlines()[0] if err.strip() else f"exit {code}"
            raise LaunchError(
                f"{spec.name}: TensorRT-LLM's MPI world needs `srun --mpi={self.mpi}` "
                f"(target.mpi) on {spec.mpi_nodes[0]}, which fails: {why}; install that "
                "plugin's library on the nodes (PMIx for pmix), or name another plugin "
                "`srun --mpi=list` shows"
            )

    def _container_args(self) -> list[str]:
        if self.container is None:
            return []
        argv = [f"--container-image={self.container.image}"]
        if self.container.mounts:
            argv.append(f"--container-mounts={','.join(self.container.mounts)}")
        return argv

    def describe(self, spec: InstanceSpec) -> list[str]:
        argv = [
            "srun",
            f"--jobid={self.extra_jobs.get(spec.host) or self.job_id or '$SLURM_JOB_ID'}",
            *_step_shape(spec, self.mpi),
            "--overlap",  # share the allocation's CPUs, memory and GPUs with the other steps
            "--kill-on-bad-exit=1",
            "--export=ALL",  # the step gets srun's environment, whatever sbatch --export said
            f"--job-name={STEP_PREFIX}{spec.name}",
        ]
        argv += self._container_args()
        env = instance_env(spec)
        if env:
            # Set inside the step: slurmstepd overwrites CUDA_VISIBLE_DEVICES passed via srun.
            argv += ["env", *(f"{key}={value}" for key, value in env.items())]
        return argv + keeper_argv(spec, self.python)

    async def start(self, spec: InstanceSpec, log: Path) -> SlurmStep:
        # srun's own environment, exported to the step (--export=ALL), never its argv.
        env = {**self._env, **read_secrets(spec)}
        job = self._job_of(spec.host)
        name = f"{STEP_PREFIX}{spec.name}"
        before = {step for step, n in (await list_steps(job, self._env)).items() if n == name}
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # noqa: ASYNC230 - a local file, opened once
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.describe(spec),
                    stdin=asyncio.subprocess.PIPE,  # forwarded to the keeper: EOF = we are gone
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{spec.name}: cannot run srun: {exc}") from exc
        step = await self._find_step(proc, job, name, before, spec, log)
        record = ProcessRecord(
            launcher="slurm", host=spec.host, pid=proc.pid, pgid=proc.pid, step=step
        )
        return SlurmStep(proc, record, self._env)

    async def _find_step(
        self,
        proc: asyncio.subprocess.Process,
        job: str,
        name: str,
        before: set[str],
        spec: InstanceSpec,
        log: Path,
    ) -> str | None:
        """The new step named ``name``; None if srun ended first (its returncode tells)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.step_timeout
        delay = 0.05
        while loop.time() < deadline:
            steps = await list_steps(job, self._env)
            new = [s for s, n in steps.items() if n == name and s not in before]
            if new:
                return new[0]
            if proc.returncode is not None:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                if proc.returncode is None:
                    os.killpg(proc.pid, sig)
                    await asyncio.wait_for(proc.wait(), 5)
        # srun may have made the step before it died, or been SIGKILLed above.
        await kill_strays(job, name, before, self._env)
        raise LaunchError(
            f"{spec.name}: no job step on {spec.host} after {self.step_timeout:.0f} s "
            f"(srun still waiting for resources?); see {log}"
        )

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        """Stop a recorded step: SIGTERM, ``grace`` for it to end, then SIGKILL."""
        if not record.step:
            return False
        job = record.step.partition(".")[0]
        if record.step not in await list_steps(job, self._env):
            return False
        loop = asyncio.get_running_loop()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_FALLBACK_S)):
            await scancel_step(record.step, sig, self._env)
            deadline = loop.time() + wait
            while loop.time() < deadline:
                if record.step not in await list_steps(job, self._env):
                    return True
                await asyncio.sleep(0.2)
        raise LaunchError(f"Slurm step {record.step} still there after SIGKILL")

    async def adopt(self, record: ProcessRecord, log: Path) -> None:
        """Never: the job ends with the batch script its supervisor runs in, so there is
        nothing to adopt (docs/operations.md, "Restarting the supervisor")."""
        return None

    async def close(self) -> None:
        """Nothing held: srun's stdin pipes close with this process, and keepers act."""


def _step_shape(spec: InstanceSpec, mpi: str) -> list[str]:
    """srun's node and task options: one task on ``host``; an MPI world (a TensorRT-LLM
    gang), ``mpi_tasks_per_node`` ranks on each of ``mpi_nodes``, wired by ``mpi``. One
    step keeps Slurm's accounting and kill semantics: ``--kill-on-bad-exit`` ends every
    rank when one fails, and the supervisor sees the one srun end."""
    if not spec.mpi_nodes:
        return ["--nodes=1", "--ntasks=1", f"--nodelist={spec.host}"]
    return [
        f"--nodes={len(spec.mpi_nodes)}",
        f"--ntasks-per-node={spec.mpi_tasks_per_node}",
        f"--nodelist={','.join(spec.mpi_nodes)}",
        f"--mpi={mpi}",
        "--label",  # "RANK: " before each output line: the ranks share one log
    ]


def from_recipe(recipe: Recipe) -> SlurmLauncher:
    """The launcher for a Slurm recipe, inside its allocation (``$SLURM_JOB_ID``)."""
    assert isinstance(recipe.target, SlurmTarget)
    return SlurmLauncher(
        container=recipe.target.container, mpi=recipe.target.mpi, stage_ahead=ahead(recipe)
    )
