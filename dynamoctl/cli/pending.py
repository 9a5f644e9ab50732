"""Commands that later issues implement; until then each says so and exits with status 2.

They accept any arguments, so scripts and docs written against the final interface (e.g.
``dynamoctl up recipes/local.yaml``) already get this clear answer instead of a usage error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import typer

NOT_IMPLEMENTED_EXIT_CODE = 2


class PendingCommand(NamedTuple):
    help: str
    issue: str
    """The issue that will implement the command."""


PENDING: dict[str, PendingCommand] = {}


def _not_implemented(name: str, issue: str) -> Callable[[], None]:
    def command() -> None:
        typer.echo(
            f"dynamoctl {name}: not implemented yet (tracked in the {issue} issue)", err=True
        )
        raise typer.Exit(NOT_IMPLEMENTED_EXIT_CODE)

    return command


def register(app: typer.Typer) -> None:
    for name, pending in PENDING.items():
        app.command(
            name,
            help=pending.help,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )(_not_implemented(name, pending.issue))
