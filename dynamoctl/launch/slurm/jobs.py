"""Slurm jobs as a whole: submitting one (``sbatch``: the deployment's own batch job, from
the login node, and the extra jobs of a grown deployment), its state and nodes
(``squeue``), signalling its batch script and cancelling it (``scancel``); and the bounded
runner of Slurm client commands that the step launcher (:mod:`dynamoctl.launch.slurm.launcher`)
shares."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.slurm.state import JobState
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SlurmTarget

CLIENT_TIMEOUT_S = 30.0
"""Seconds a Slurm client command (sbatch, squeue, scancel, scontrol) may take."""


# Inherited from the allocation, each of these reshapes or breaks a nested step (measured
# with Slurm 22.05: SRUN_CPUS_PER_TASK → "More processors requested than permitted",
# SLURM_MEM_PER_NODE next to the job's SLURM_MEM_PER_CPU → fatal, SLURM_GPUS_PER_NODE on a
# GPU-less node → "Invalid gres", SLURM_EXPORT_ENV=NONE → no PATH in the step,
# SLURM_STDOUTMODE → output away from the log). Options srun is given override the rest.
_STRIPPED = """
    SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE SLURM_NTASKS_PER_CORE SLURM_NTASKS_PER_GPU
    SLURM_NTASKS_PER_SOCKET SLURM_CPUS_PER_TASK SRUN_CPUS_PER_TASK SLURM_CPUS_PER_GPU
    SLURM_TRES_PER_TASK SLURM_MEM_PER_CPU SLURM_MEM_PER_GPU SLURM_MEM_PER_NODE SLURM_GPUS
    SLURM_GPUS_PER_NODE SLURM_GPUS_PER_TASK SLURM_GRES SLURM_STEP_GRES SLURM_GRES_FLAGS
    SLURM_EXACT SLURM_EXCLUSIVE SLURM_OVERCOMMIT SLURM_DISTRIBUTION SLURM_DIST_PLANESIZE
    SLURM_HINT SLURM_CPU_BIND SLURM_MEM_BIND SLURM_GPU_BIND SLURM_THREADS_PER_CORE
    SLURM_CORE_SPEC SLURM_THREAD_SPEC SLURM_TIMELIMIT SLURM_CONSTRAINT SLURM_NETWORK
    SLURM_STDOUTMODE SLURM_STDERRMODE SLURM_STDINMODE SLURM_OPEN_MODE SLURM_LABELIO
    SLURM_EXPORT_ENV SRUN_EXPORT_ENV SLURM_KILL_BAD_EXIT SLURM_NO_KILL SLURM_WAIT SLURM_SIGNAL
    SRUN_CONTAINER SLURM_TASK_PROLOG SLURM_TASK_EPILOG SLURM_SPREAD_JOB SLURM_USE_MIN_NODES
"""
STRIPPED_ENV = frozenset(_STRIPPED.split())


def step_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the allocation variables that would constrain a nested step."""
    return {key: value for key, value in environ.items() if key not in STRIPPED_ENV}


async def run_client(
    argv: Sequence[str], env: Mapping[str, str], timeout: float = CLIENT_TIMEOUT_S
) -> tuple[int, str, str]:
    """Run a Slurm client command; (returncode, stdout, stderr). Bounded by ``timeout``."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
        )
    except OSError as exc:
        raise LaunchError(f"cannot run {argv[0]!r}: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise LaunchError(f"{' '.join(argv)}: no answer in {timeout:.0f} s") from None
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def client_output(argv: Sequence[str], env: Mapping[str, str], gone_ok: bool = False) -> str:
    """stdout, or LaunchError; with ``gone_ok``, a job Slurm no longer knows gives ``""``."""
    code, out, err = await run_client(argv, env)
    if code != 0 and not (gone_ok and "Invalid job id" in err):
        raise LaunchError(f"{' '.join(argv)} failed ({code}): {err.strip()}")
    return out


async def job_nodes(job: str, env: Mapping[str, str]) -> list[str]:
    """Host names of a running job's nodes; LaunchError if it is not running."""
    out = await client_output(["squeue", f"--jobs={job}", "-h", "-o", "%T %N"], env, gone_ok=True)
    state, _, nodelist = out.strip().partition(" ")
    if not state or JobState(state) is not JobState.RUNNING or not nodelist:
        raise LaunchError(f"Slurm job {job} is not running (state: {state or 'gone'})")
    hosts = await client_output(["scontrol", "show", "hostnames", nodelist], env)
    return hosts.split()


def sbatch_resources(target: SlurmTarget) -> list[str]:
    """The ``sbatch`` options that give an allocation the shape the recipe needs."""
    args = [f"--nodes={target.nodes}"]
    if target.gpus_per_node > 0:
        args.append(f"--gpus-per-node={target.gpus_per_node}")
    return [*args, f"--partition={target.partition}"]


BATCH_SCRIPT = Path(__file__).with_name("batch.sh")
"""The batch script that runs ``dynamoctl up`` in the allocation (``slurm/launch.sh``)."""
DRAIN_SIGNAL_MARGIN_S = 60
"""Seconds the drain signal leaves beyond ``drain_timeout``: routers, frontend, etcd stop
after the workers."""


def drain_signal(drain_timeout: float) -> str:
    """``--signal=B:TERM@N``: SIGTERM to the batch script (the supervisor, which drains)
    ``N`` seconds before the time limit; at least the batch script's own 120 s."""
    lead = max(120, math.ceil(drain_timeout) + DRAIN_SIGNAL_MARGIN_S)
    return f"--signal=B:TERM@{lead}"


def sbatch_args(
    target: SlurmTarget, *, job_name: str, output: Path, drain_timeout: float
) -> list[str]:
    """``sbatch`` options for a recipe's Slurm target (``extra_sbatch_args`` last, verbatim)."""
    args = [f"--job-name={job_name}", f"--output={output}", *sbatch_resources(target)]
    args.append(drain_signal(drain_timeout))
    if target.account:
        args.append(f"--account={target.account}")
    if target.time_limit:
        args.append(f"--time={target.time_limit}")
    return args + list(target.extra_sbatch_args)


async def submit(
    target: SlurmTarget,
    script: Path,
    args: Sequence[str] = (),
    *,
    job_name: str,
    output: Path,
    drain_timeout: float,
    env: Mapping[str, str] | None = None,
) -> str:
    """Submit ``script args`` as a batch job shaped by ``target``; its job id."""
    options = sbatch_args(target, job_name=job_name, output=output, drain_timeout=drain_timeout)
    argv = ["sbatch", "--parsable", *options, str(script), *args]
    out = await client_output(argv, os.environ if env is None else env)
    job_id = out.strip().split(";")[0]  # "JOBID" or "JOBID;CLUSTER"
    if not job_id.isdigit():
        raise LaunchError(f"sbatch printed no job id: {out.strip()!r}")
    return job_id


async def submit_recipe(
    recipe: Recipe, recipe_path: Path, *, output: Path, env: Mapping[str, str] | None = None
) -> str:
    """Submit :data:`BATCH_SCRIPT` for ``recipe`` (what ``sbatch slurm/launch.sh RECIPE``
    does, with the recipe's options); its job id. The job runs ``dynamoctl up`` with this
    interpreter (``DYNAMOCTL_PYTHON``)."""
    assert isinstance(recipe.target, SlurmTarget)
    return await submit(
        recipe.target,
        BATCH_SCRIPT,
        [str(recipe_path)],
        job_name=f"dynamoctl-{recipe.name}",
        output=output,
        drain_timeout=recipe.supervision.drain_timeout,
        env={**(os.environ if env is None else env), "DYNAMOCTL_PYTHON": sys.executable},
    )


async def job_state(job_id: str, env: Mapping[str, str] | None = None) -> JobState | None:
    """The job's state; None once Slurm forgot it."""
    argv = ["squeue", f"--jobs={job_id}", "--states=all", "-h", "-o", "%T"]
    out = await client_output(argv, os.environ if env is None else env, gone_ok=True)
    return JobState(out.strip()) if out.strip() else None


async def signal_batch(job_id: str, sig: int, env: Mapping[str, str] | None = None) -> bool:
    """Send ``sig`` to the job's batch script only (there, the supervisor); False if the
    job is gone."""
    name = signal.Signals(sig).name.removeprefix("SIG")
    argv = ["scancel", "--batch", f"--signal={name}", job_id]
    code, _, _ = await run_client(argv, os.environ if env is None else env)
    return code == 0


async def cancel(job_id: str, env: Mapping[str, str] | None = None) -> None:
    """Cancel the job and every step in it (no error if it has already ended)."""
    await client_output(["scancel", job_id], os.environ if env is None else env, gone_ok=True)
