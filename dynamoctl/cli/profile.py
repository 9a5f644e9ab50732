"""``dynamoctl profile RECIPE``: measure the performance profile the planner reads.

It measures the recipe's *running* deployment (``dynamoctl up`` first), through its
frontend, as ``dynamoctl bench RECIPE`` does: what is profiled is the engine, GPUs and
engine arguments the recipe deploys, on the nodes it runs on. A profile is of one replica,
so every worker pool must have exactly one ready replica (``dynamoctl scale POOL=1``);
nothing else should load the deployment meanwhile. docs/planner.md, "Profiles".

Its flags are :class:`dynamoctl.planner.sweep.ProfileOptions`' fields (declared once).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dynamoctl.planner.sweep import ProfileOptions
from dynamoctl.settings import with_options

if TYPE_CHECKING:
    from dynamoctl.bench.runner import Target
    from dynamoctl.planner.perf import Profile
    from dynamoctl.planner.sweep import Identity

EXAMPLES = """Examples:

  dynamoctl up -d recipes/local.yaml && dynamoctl profile recipes/local.yaml

  dynamoctl profile recipe.yaml --pool decode --batch 1,8,32 --context 1024,4096 --out p.json
"""


def register(app: typer.Typer) -> None:
    app.command("profile", epilog=EXAMPLES)(with_options(profile, options=ProfileOptions))


def _fail(message: str) -> typer.Exit:
    typer.echo(f"dynamoctl profile: {message}", err=True)
    return typer.Exit(1)


def one_replica_each(instances: list[tuple[str, str, str, int]], pool: str) -> str | None:
    """Why a deployment cannot be profiled (None if it can): ``instances`` are (name,
    pool, state, rank) of its workers; every pool needs exactly one ready replica (gang
    followers do not count), the profiled ``pool`` at least that one."""
    ready = [(name, p) for name, p, state, rank in instances if state == "READY" and rank == 0]
    counts = Counter(p for _, p in ready)
    if counts[pool] == 0:
        return f"pool {pool} has no ready replica (see `dynamoctl status`)"
    for other, count in sorted(counts.items()):
        if count > 1:
            names = ", ".join(name for name, p in ready if p == other)
            return (
                f"a profile is of one replica, and pool {other} has {count} ready ({names}): "
                f"`dynamoctl scale {other}=1` first"
            )
    return None


def _check_deployment(name: str, pool: str) -> None:
    """Exit 1 unless deployment ``name`` serves with one ready replica per pool."""
    from dynamoctl.cli.locate import not_running
    from dynamoctl.control.client import ControlClient, ControlError
    from dynamoctl.supervisor.rundir import RunDir

    run_dir = RunDir(name)
    state = run_dir.read_state() if run_dir.known() else None
    why = "not started" if state is None else (not_running(run_dir, state) or (None, ""))[1]
    if why or state is None:
        raise _fail(f"deployment {name} is {why}: start it with `dynamoctl up -d RECIPE`")
    client = ControlClient(state.control, state.token)
    try:
        report = client.status()
    except ControlError as exc:
        raise _fail(str(exc)) from exc
    finally:
        client.close()
    workers = [
        (row.name, row.pool, str(row.state), row.rank)
        for row in report.instances
        if row.component == "worker"
    ]
    problem = one_replica_each(workers, pool)
    if problem is not None:
        raise _fail(f"{name}: {problem}")


def profile(
    recipe_path: Path = typer.Argument(..., help="Recipe of the running deployment to measure."),
    *,
    options: ProfileOptions,
) -> None:
    """Measure prefill time against prompt length and ITL against batch size and context
    on the recipe's running deployment (one replica per pool), and write the profile file
    the planner reads (model, engine and GPUs per replica recorded)."""
    from dynamoctl.bench.http import ProtocolError
    from dynamoctl.bench.runner import endpoint_of
    from dynamoctl.planner.perf import ProfileError, load_profile
    from dynamoctl.planner.sweep import SweepError, encode_profile, pool_identity
    from dynamoctl.recipe.loader import RecipeError, load_recipe

    try:
        recipe = load_recipe(recipe_path)
    except RecipeError as exc:
        raise _fail(str(exc)) from exc
    except OSError as exc:
        raise _fail(f"cannot read {recipe_path}: {exc.strerror}") from exc
    try:
        pool, identity = pool_identity(recipe, options.pool)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pool") from exc
    _check_deployment(recipe.name, pool)
    try:
        target = endpoint_of(str(recipe_path))
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    out = options.out or Path(f"profile-{recipe.name}-{pool}.json")
    try:
        # The standard loop: its clock is time.monotonic, where uvloop's ticks in whole
        # milliseconds (an ITL under 1 ms would read 0).
        measured = asyncio.run(_measure(target, recipe.model.name, identity, options, recipe.name))
    except (SweepError, OSError, ProtocolError) as exc:
        raise _fail(str(exc)) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encode_profile(measured))
    try:
        load_profile(out)  # what the planner will do with it
    except ProfileError as exc:  # a bug here, not the operator's
        raise _fail(f"wrote {out}, but it does not read back: {exc}") from exc
    typer.echo(
        f"wrote {out} ({len(measured.prefill)} prefill, {len(measured.decode)} decode points)"
    )


async def _measure(
    target: Target, model: str, identity: Identity, options: ProfileOptions, name: str
) -> Profile:
    from dynamoctl.bench.client import Sender
    from dynamoctl.bench.clock import LoopClock
    from dynamoctl.bench.runner import authorized
    from dynamoctl.planner.perf import DecodePoint, PrefillPoint
    from dynamoctl.planner.sweep import sweep

    headers = authorized({}, target.api_key)
    sender = Sender(target.endpoint, model, LoopClock(), timeout=options.timeout, headers=headers)

    def show(point: PrefillPoint | DecodePoint) -> None:
        if isinstance(point, PrefillPoint):
            typer.echo(f"prefill  ISL {point.isl:>6}: {point.seconds * 1e3:8.1f} ms")
        else:
            typer.echo(
                f"decode   batch {point.batch:>4} context {point.context:>6}: "
                f"ITL {point.itl * 1e3:7.2f} ms"
            )

    plan = options.plan()
    source = (
        f"dynamoctl profile of deployment {name} at {target.endpoint.base_url} (seed {plan.seed})"
    )
    try:
        return await sweep(sender, plan, identity, source=source, on_point=show)
    finally:
        await target.endpoint.close()
