"""``dynamoctl router``: a standalone router replica, asked by ``frontend --router
standalone`` (its flags are :class:`~dynamoctl.settings.RouterOptions`' fields)."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.settings import RouterOptions, with_options


def register(app: typer.Typer) -> None:
    app.command("router")(with_options(router, options=RouterOptions))


def router(*, options: RouterOptions) -> None:
    """Route requests for every model of the namespace; frontends ask it, tokens bypass it.

    Run several for availability: they share their bookings and decide alike.
    """
    from dynamoctl.router.standalone.main import run_router

    common.check_router_mode(options.router)
    common.run_component("router", options.namespace, run_router(options))
