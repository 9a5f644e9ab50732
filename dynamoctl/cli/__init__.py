"""The ``dynamoctl`` command line: every component and every operator action is a subcommand.

Each command group lives in its own module exposing ``register(app)``; a new group is a new
module plus one entry in ``_GROUPS``.
"""

from __future__ import annotations

import typer

from dynamoctl import __version__
from dynamoctl.cli import bench as bench_cli
from dynamoctl.cli import configure as configure_cli
from dynamoctl.cli import (
    deploy,
    discovery,
    follower,
    frontend,
    operate,
    planner,
    profile,
    recipe,
    router,
    worker,
)

app = typer.Typer(name="dynamoctl", no_args_is_help=True, add_completion=False)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dynamoctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """LLM serving on Slurm, SSH-reachable nodes or one workstation, without Kubernetes."""


_GROUPS = (
    recipe,
    discovery,
    worker,
    follower,
    frontend,
    router,
    planner,
    deploy,
    operate,
    bench_cli,
    profile,
    configure_cli,
)
for _group in _GROUPS:
    _group.register(app)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="dynamoctl")
