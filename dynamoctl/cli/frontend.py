"""``dynamoctl frontend``: the OpenAI-compatible HTTP endpoint (its flags are
:class:`~dynamoctl.settings.FrontendOptions`' fields)."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.settings import FrontendOptions, with_options


def register(app: typer.Typer) -> None:
    app.command("frontend")(with_options(frontend, options=FrontendOptions))


def frontend(*, options: FrontendOptions) -> None:
    """Serve the OpenAI API for every model the namespace's workers serve."""
    from dynamoctl.frontend.main import run_frontend

    common.check_router_mode(options.router)
    common.run_component("frontend", options.namespace, run_frontend(options))
