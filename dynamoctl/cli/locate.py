"""Finding the deployment a command is about (by name, or the one that is running), and
telling whether its supervisor can be asked anything.

On a login node the run directory (shared storage) is all there is: a deployment submitted
to Slurm is judged by its job's state, not by the run directory's lock, because a lock
taken on a compute node need not be visible on another host (Lustre's ``localflock``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import typer

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.slurm.state import JobState
from dynamoctl.supervisor.rundir import RunDir, RunState, deployments, home
from dynamoctl.wire.states import Phase

if TYPE_CHECKING:
    from dynamoctl.recipe.models import Recipe


def find_deployment(name: str | None, running_only: bool = True) -> RunDir:
    """``name``'s run directory; without a name, the single running deployment (or the one
    whose Slurm job is queued), or (``running_only=False``: ``status``, ``logs``, ``down``)
    the only one known, so that a command answers the same with its name and without."""
    if name is not None:
        run_dir = RunDir(name)
        if not run_dir.known():
            typer.echo(f"no deployment named {name!r} (run directories in {home()})", err=True)
            raise typer.Exit(1)
        return run_dir
    running = [d for d in deployments() if d.is_locked() or _in_slurm(d)]
    if len(running) == 1:
        return running[0]
    if not running:
        known = [d.name for d in deployments()]
        if len(known) == 1 and not running_only:
            return RunDir(known[0])  # answered as if named: `status` says it is not running
        hint = f"; known: {', '.join(known)}" if known and not running_only else ""
        typer.echo(f"no deployment is running{hint}", err=True)
        raise typer.Exit(1)
    names = ", ".join(d.name for d in running)
    typer.echo(f"several deployments are running ({names}): name one", err=True)
    raise typer.Exit(1)


def recipe_of(state: RunState) -> Recipe:
    from dynamoctl.recipe.loader import RecipeError, load_recipe  # ~0.3 s: its commands only

    try:
        return load_recipe(state.recipe)
    except (RecipeError, OSError) as exc:
        typer.echo(f"cannot read the deployment's recipe {state.recipe}: {exc}", err=True)
        raise typer.Exit(1) from exc


def not_running(run_dir: RunDir, state: RunState | None) -> tuple[Phase, str] | None:
    """None when the supervisor should answer; else (phase, one line saying why not)."""
    job = run_dir.slurm_job(state)
    if job is not None:
        slurm = _job_state(job)
        if slurm and slurm.queued:
            return Phase.QUEUED, (
                f"Slurm job {job} is {slurm.value.lower()} in the queue; its supervisor has "
                f"not started (squeue --jobs={job})"
            )
        if slurm and slurm.active and slurm is not JobState.COMPLETING:
            if state is None or state.slurm_job != job or not state.control:
                return Phase.STARTING, (
                    f"Slurm job {job} is {slurm.lower()}, its supervisor has not opened its "
                    "control endpoint yet: try again in a moment"
                )
            if state.phase in (Phase.STOPPED, Phase.FAILED):
                error = f": {state.error}" if state.error else ""
                return state.phase, f"not running (last phase {state.phase}{error})"
            return None
        elif slurm is not None:  # None: squeue failed, so judge by the lock, below
            ended = f"is {slurm.value.lower()}" if slurm else "is no longer known to Slurm"
            phase = state.phase if state else Phase.UNKNOWN
            return phase, f"not running (Slurm job {job} {ended}; last phase {phase})"
    if state is not None and run_dir.is_locked():
        return None
    phase = state.phase if state else Phase.UNKNOWN
    error = f": {state.error}" if state and state.error else ""
    return phase, f"not running (last phase {phase}{error})"


def _in_slurm(run_dir: RunDir) -> bool:
    """Whether the deployment's Slurm job is queued or running."""
    job = run_dir.slurm_job(run_dir.read_state())
    if job is None:
        return False
    slurm = _job_state(job)
    return isinstance(slurm, JobState) and not slurm.ended


def _job_state(job: str) -> JobState | Literal[""] | None:
    """The job's Slurm state, ``""`` once Slurm forgot it, None if squeue cannot tell."""
    from dynamoctl.launch.slurm.jobs import job_state
    from dynamoctl.util import aio

    try:
        return aio.run(job_state(job)) or ""
    except LaunchError:  # no Slurm client on this host
        return None
