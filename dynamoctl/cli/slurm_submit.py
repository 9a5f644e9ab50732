"""``dynamoctl up`` on a login node with a Slurm target: submit the job and follow it."""

from __future__ import annotations

from pathlib import Path

import typer

from dynamoctl.recipe.models import Recipe
from dynamoctl.supervisor.rundir import RunDir


def submit_and_follow(recipe: Recipe, recipe_path: Path, run_dir: RunDir) -> None:
    typer.echo(
        "dynamoctl up: submitting from a login node is not wired yet; run "
        f"`sbatch slurm/launch.sh {recipe_path}`",
        err=True,
    )
    raise typer.Exit(2)
