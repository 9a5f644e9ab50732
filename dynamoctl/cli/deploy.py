"""``dynamoctl up`` and ``dynamoctl down``: bring a recipe's deployment up, take it down."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import typer

from dynamoctl.cli.locate import find_deployment, recipe_of
from dynamoctl.supervisor.rundir import RunDir
from dynamoctl.wire.states import Phase

if TYPE_CHECKING:
    from dynamoctl.recipe.models import Recipe

# The recipe models (~0.3 s of imports) are imported by the commands that read a recipe:
# `down` of a running deployment starts without them (tests/test_cli_lazy.py).


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("adopt")(adopt)
    app.command("down")(down)
    app.command("lb-config")(lb_config)


def _load(path: Path) -> Recipe:
    from dynamoctl.recipe.loader import RecipeError, load_recipe

    try:
        return load_recipe(path)
    except RecipeError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    except OSError as exc:
        typer.echo(f"dynamoctl up: cannot read {path}: {exc.strerror}", err=True)
        raise typer.Exit(1) from exc


def allocation_nodes() -> list[str] | None:
    """The current Slurm allocation's nodes, or None outside an allocation."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def up(
    recipe_path: Path = typer.Argument(..., help="Recipe file, e.g. recipes/local.yaml."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Supervise in the background."),
    live: bool = typer.Option(True, help="Live status table (foreground, on a terminal)."),
    nodes: str | None = typer.Option(
        None,
        help="With --dry-run, a Slurm target: the allocation's nodes (NODE,NODE,...) to plan "
        "for, instead of symbolic node0, node1, ...",
    ),
    resolve: list[str] = typer.Option(
        [],
        help="With --dry-run: NAME=IPV4 gives a host's address instead of resolving its name "
        "here (repeatable, like curl --resolve).",
    ),
) -> None:
    """Start the deployment a recipe describes and supervise it (Ctrl-C stops it)."""
    from dynamoctl.launch.registry import launcher_for
    from dynamoctl.plan.build import PlanError, build_plan, render
    from dynamoctl.plan.hosts import HostError, parse_resolve
    from dynamoctl.recipe.targets import SlurmTarget

    if not dry_run and (nodes or resolve):
        raise typer.BadParameter("only with --dry-run", param_hint="--nodes/--resolve")
    recipe = _load(recipe_path)
    run_dir = RunDir(recipe.name)
    is_slurm = isinstance(recipe.target, SlurmTarget)
    if nodes and not is_slurm:
        raise typer.BadParameter("names Slurm nodes; this recipe's target is not slurm")
    allocation = (nodes.split(",") if nodes else allocation_nodes()) if is_slurm else None
    try:
        plan, _ = build_plan(recipe, run_dir.path, allocation, parse_resolve(resolve))
    except (PlanError, HostError) as exc:
        typer.echo(f"{recipe_path}: {exc}", err=True)
        raise typer.Exit(1) from exc
    if dry_run:
        typer.echo(render(plan, launcher_for(recipe).describe), nl=False)
        return
    _refuse_open_doors(recipe, recipe_path)
    if is_slurm and allocation is None:
        from dynamoctl.cli.slurm_submit import submit_and_follow

        submit_and_follow(recipe, recipe_path, run_dir, timeout=600.0)
        return
    if detach:
        _detach(recipe, recipe_path, run_dir)
        return
    _foreground(recipe, recipe_path, run_dir, allocation, live and sys.stdout.isatty())


def lb_config(
    recipe_path: Path = typer.Argument(..., help="Recipe file of the deployment."),
    bind: str = typer.Option("0.0.0.0:8080", help="ADDRESS:PORT clients connect to."),
    check_interval_ms: int = typer.Option(500, min=50, help="Health-check interval."),
    resolve: list[str] = typer.Option(
        [], help="NAME=IPV4 gives a host's address instead of resolving its name here."
    ),
) -> None:
    """Print an HAProxy configuration balancing the deployment's frontends (one server per
    frontend host, health-checked on /health; docs/operations.md, "Many frontends")."""
    from dynamoctl.plan.build import PlanError, build_plan
    from dynamoctl.plan.haproxy import render_haproxy
    from dynamoctl.plan.hosts import HostError, parse_resolve

    recipe = _load(recipe_path)
    try:
        plan, _ = build_plan(recipe, RunDir(recipe.name).path, None, parse_resolve(resolve))
    except (PlanError, HostError) as exc:
        typer.echo(f"{recipe_path}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        render_haproxy(plan.name, plan.namespace, plan.instances, bind, check_interval_ms),
        nl=False,
    )


def _refuse_open_doors(recipe: Recipe, recipe_path: Path) -> None:
    """Exit 1 naming what a multi-host recipe would leave open without saying so."""
    from dynamoctl.supervisor.doors import open_doors

    doors = open_doors(recipe)
    for door in doors:
        typer.echo(f"{recipe_path}: {door}", err=True)
    if doors:
        typer.echo('dynamoctl up: refused (docs/security.md, "Locked by default")', err=True)
        raise typer.Exit(1)


def adopt(
    name: str | None = typer.Argument(None, help="Deployment name (default: the only one)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Supervise in the background."),
    live: bool = typer.Option(True, help="Live status table (foreground, on a terminal)."),
) -> None:
    """Take back a deployment whose supervisor died while its instances still run: `up`
    of the recipe it was started from (what `dynamoctl up RECIPE` does as well)."""
    from dynamoctl.recipe.targets import SlurmTarget

    run_dir = find_deployment(name, running_only=False)
    if run_dir.is_locked():
        typer.echo(f"dynamoctl adopt: {run_dir.name} has a running supervisor", err=True)
        raise typer.Exit(1)
    state = run_dir.read_state()
    if state is None or not state.records:
        typer.echo(
            f"dynamoctl adopt: nothing of {run_dir.name} is recorded as running; start it "
            "with `dynamoctl up RECIPE`",
            err=True,
        )
        raise typer.Exit(1)
    recipe = recipe_of(state)
    if isinstance(recipe.target, SlurmTarget):
        typer.echo("dynamoctl adopt: a Slurm job ends with its supervisor", err=True)
        raise typer.Exit(1)
    if detach:
        _detach(recipe, Path(state.recipe), run_dir)
        return
    _foreground(recipe, Path(state.recipe), run_dir, None, live and sys.stdout.isatty())


def _foreground(
    recipe: Recipe, recipe_path: Path, run_dir: RunDir, allocation: list[str] | None, live: bool
) -> None:
    from dynamoctl.cli.view import LiveView
    from dynamoctl.supervisor.serve import UpError, serve
    from dynamoctl.util import aio
    from dynamoctl.util import log as logsetup

    logsetup.setup(f"supervisor/{recipe.name}")
    logsetup.also_to(run_dir.path / "supervisor.log")  # what `logs supervisor` reads
    logging.getLogger(__name__).info(
        "logs: supervisor %s, instances %s/ (`dynamoctl logs NAME` reads them)",
        run_dir.path / "supervisor.log",
        run_dir.logs,
    )
    view = LiveView(live)
    try:
        with view:
            aio.run(serve(recipe, recipe_path.resolve(), run_dir, allocation, on_start=view.attach))
    except UpError as exc:
        typer.echo(f"dynamoctl up: {exc}", err=True)
        raise typer.Exit(1) from exc


def _detach(recipe: Recipe, recipe_path: Path, run_dir: RunDir) -> None:
    """Start a supervisor in its own session; return once it serves (or failed)."""
    run_dir.create()  # private before the first file (docs/security.md)
    with open(run_dir.path / "supervisor.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamoctl", "up", str(recipe_path), "--no-live"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    while True:
        time.sleep(0.1)
        state = run_dir.read_state()
        mine = state is not None and state.supervisor_pid == proc.pid
        if mine and state is not None and state.phase is Phase.SERVING:
            assert state.plan is not None
            typer.echo(f"{recipe.name}: serving {state.plan.model} at {state.plan.endpoint}")
            typer.echo(f"supervisor pid {proc.pid}; log {run_dir.path / 'supervisor.log'}")
            return
        if proc.poll() is not None:
            text = (run_dir.path / "supervisor.log").read_text(errors="replace")
            typer.echo(text[-4000:], err=True, nl=False)
            typer.echo(
                f"dynamoctl up: the supervisor exited with status {proc.returncode}", err=True
            )
            raise typer.Exit(1)


def down(
    name: str | None = typer.Argument(None, help="Deployment name (default: the running one)."),
    now: bool = typer.Option(False, "--now", help="Do not drain: SIGTERM, 3 s, SIGKILL."),
    timeout: float = typer.Option(120.0, help="Seconds to wait for the supervisor to finish."),
) -> None:
    """Drain and stop a deployment; cleans up after a supervisor that was killed, too."""
    from dynamoctl.cli.slurm_submit import cancel_job
    from dynamoctl.control.client import ControlClient, ControlError

    run_dir = find_deployment(name, running_only=False)
    state = run_dir.read_state()
    if cancel_job(run_dir, timeout):  # submitted from this login node
        return
    if run_dir.is_locked() and state is not None:
        client = ControlClient(state.control, state.token)
        try:
            client.down(now)
        except ControlError as exc:
            typer.echo(f"dynamoctl down: {exc}", err=True)
            raise typer.Exit(1) from exc
        finally:
            client.close()
        deadline = time.monotonic() + timeout
        # The lock is released in the supervisor's finally, a moment before its process
        # ends: "stopped" means the process is gone too.
        while run_dir.is_locked() or _alive(state.supervisor_pid):
            if time.monotonic() > deadline:
                typer.echo(f"dynamoctl down: {run_dir.name} still stopping after {timeout:.0f} s")
                raise typer.Exit(1)
            time.sleep(0.2)
        typer.echo(f"{run_dir.name}: stopped")
        return
    _reap_without_supervisor(run_dir)


def _reap_without_supervisor(run_dir: RunDir) -> None:
    from dynamoctl.supervisor.serve import reap_leftovers
    from dynamoctl.util import aio

    state = run_dir.read_state()
    if state is None or not state.records:
        typer.echo(f"{run_dir.name}: not running, nothing left to stop")
        return
    recipe = recipe_of(state)
    reaped = aio.run(reap_leftovers(recipe, run_dir))
    if reaped:
        typer.echo(f"{run_dir.name}: supervisor gone; stopped {', '.join(reaped)}")
    else:
        typer.echo(f"{run_dir.name}: supervisor gone; nothing was left running")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
