"""``dynamoctl planner``: the SLA planner (its flags are
:class:`~dynamoctl.planner.settings.PlannerOptions`' fields; docs/planner.md)."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.planner.settings import PlannerOptions
from dynamoctl.settings import with_options


def register(app: typer.Typer) -> None:
    app.command("planner")(with_options(planner, options=PlannerOptions))


def planner(*, options: PlannerOptions) -> None:
    """Size the worker pools to the TTFT and ITL targets within the GPU budget.

    Scales through the supervisor (token in DYNAMOCTL_CONTROL_TOKEN): scale-downs drain.
    """
    from dynamoctl.planner.main import run_planner

    common.run_component("planner", options.namespace, run_planner(options))
