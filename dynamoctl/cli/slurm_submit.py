"""``dynamoctl up`` on a login node with a Slurm target: submit the job and follow it.

The job runs the same batch script as ``sbatch slurm/launch.sh RECIPE``
(:data:`dynamoctl.launch.slurm.jobs.BATCH_SCRIPT`), with the recipe's resources and a drain
signal. The run directory must be on storage the nodes share (the
default, under ``$HOME``, usually is): the supervisor writes its state there, and this
command waits for it to say "serving".
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dynamoctl.supervisor.rundir import JOB_FILE, RunDir
from dynamoctl.util import aio
from dynamoctl.wire.states import Phase

if TYPE_CHECKING:
    from dynamoctl.recipe.models import Recipe


def submit_and_follow(recipe: Recipe, recipe_path: Path, run_dir: RunDir, timeout: float) -> None:
    from dynamoctl.launch.slurm.jobs import job_state, submit_recipe

    run_dir.create()  # private before the first file (docs/security.md)
    output = run_dir.path / "supervisor.log"
    job = aio.run(submit_recipe(recipe, recipe_path.resolve(), output=output))
    run_dir.write_slurm_job(job)
    typer.echo(f"{recipe.name}: submitted Slurm job {job}; supervisor log {output}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = run_dir.read_state()
        if state is not None and state.phase is Phase.SERVING and state.plan is not None:
            typer.echo(f"{recipe.name}: serving {state.plan.model} at {state.plan.endpoint}")
            return
        slurm_state = aio.run(job_state(job))
        if slurm_state is None or slurm_state.ended:
            how = slurm_state.value if slurm_state else "gone from the queue"
            typer.echo(f"dynamoctl up: Slurm job {job} ended ({how}); see {output}", err=True)
            raise typer.Exit(1)
        time.sleep(1.0)
    typer.echo(f"dynamoctl up: job {job} not serving after {timeout:.0f} s (still queued?)")
    raise typer.Exit(1)


def cancel_job(run_dir: RunDir, timeout: float) -> bool:
    """Stop a submitted deployment: SIGTERM to the supervisor (it drains and stops every
    step), then ``scancel`` whatever is left. False if no job was recorded."""
    from dynamoctl.launch.slurm.jobs import cancel, job_state, signal_batch

    job = run_dir.slurm_job(None)
    if job is None:
        return False
    aio.run(signal_batch(job, signal.SIGTERM))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = aio.run(job_state(job))
        if state is None or not state.active:
            break
        time.sleep(1.0)
    aio.run(cancel(job))
    (run_dir.path / JOB_FILE).unlink(missing_ok=True)
    typer.echo(f"{run_dir.name}: Slurm job {job} ended")
    return True
