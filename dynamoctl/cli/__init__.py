"""The ``dynamoctl`` command line: every component and every operator action is a subcommand.

Each command group lives in its own module exposing ``register(app)``; a new group is a new
module plus one entry in ``GROUPS``.

A process imports only the group of the command it runs: the supervisor starts every
worker, frontend, router and planner as a ``dynamoctl`` command, and importing all twelve
groups (recipe models, AI Configurator's options, numpy for bench and profile, ...) took
each start about a second more than its own group does.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

import typer

from dynamoctl import __version__

GROUPS: dict[str, tuple[str, ...]] = {
    "recipe": ("recipe",),
    "discovery": ("discovery",),
    "worker": ("worker",),
    "follower": ("follower",),
    "frontend": ("frontend",),
    "router": ("router",),
    "planner": ("planner",),
    "deploy": ("up", "adopt", "down", "lb-config"),
    "operate": ("status", "drain", "scale", "logs"),
    "lora": ("lora",),
    "keys": ("keys",),
    "bench": ("bench",),
    "profile": ("profile",),
    "configure": ("configure",),
}
"""Each group module of ``dynamoctl.cli`` and the commands its ``register`` adds, in the
order ``--help`` lists them (tests/test_cli_lazy.py checks the commands)."""


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dynamoctl {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """LLM serving on Slurm, SSH-reachable nodes or one workstation, without Kubernetes."""


def build_app(groups: Iterable[str] = GROUPS) -> typer.Typer:
    """The command line with the commands of ``groups`` (module names of ``GROUPS``)."""
    app = typer.Typer(name="dynamoctl", no_args_is_help=True, add_completion=False)
    app.callback()(_root)
    for group in groups:
        importlib.import_module(f"dynamoctl.cli.{group}").register(app)
    return app


def groups_for(args: list[str]) -> tuple[str, ...]:
    """The groups a command line needs: the one owning its command, or all of them when it
    names none or an unknown one (``--help`` lists every command; typer names the unknown)."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    owner = [group for group, commands in GROUPS.items() if command in commands]
    return tuple(owner) or tuple(GROUPS)


def __getattr__(name: str) -> typer.Typer:
    """``app``, the whole command line, built on first use (tests invoke it in-process)."""
    if name == "app":
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    build_app(groups_for(sys.argv[1:]))(prog_name="dynamoctl")
