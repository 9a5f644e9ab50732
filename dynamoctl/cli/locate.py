"""Finding the deployment a command is about: by name, or the one that is running."""

from __future__ import annotations

import typer

from dynamoctl.recipe.loader import RecipeError, load_recipe
from dynamoctl.recipe.models import Recipe
from dynamoctl.supervisor.rundir import RunDir, RunState, deployments, home


def find_deployment(name: str | None, running_only: bool = True) -> RunDir:
    """``name``'s run directory; without a name, the single running deployment."""
    if name is not None:
        run_dir = RunDir(name)
        if run_dir.read_state() is None:
            typer.echo(f"no deployment named {name!r} (run directories in {home()})", err=True)
            raise typer.Exit(1)
        return run_dir
    running = [d for d in deployments() if d.is_locked()]
    if len(running) == 1:
        return running[0]
    if not running:
        known = [d.name for d in deployments()]
        hint = f"; known: {', '.join(known)}" if known and not running_only else ""
        typer.echo(f"no deployment is running{hint}", err=True)
        raise typer.Exit(1)
    names = ", ".join(d.name for d in running)
    typer.echo(f"several deployments are running ({names}): name one", err=True)
    raise typer.Exit(1)


def recipe_of(state: RunState) -> Recipe:
    try:
        return load_recipe(state.recipe)
    except (RecipeError, OSError) as exc:
        typer.echo(f"cannot read the deployment's recipe {state.recipe}: {exc}", err=True)
        raise typer.Exit(1) from exc
