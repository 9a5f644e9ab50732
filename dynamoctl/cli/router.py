"""``dynamoctl router``: a standalone router replica, asked by ``frontend --router standalone``."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.settings import RouterSettings, with_options


def register(app: typer.Typer) -> None:
    app.command("router")(with_options(router, settings=RouterSettings))


def router(
    namespace: str = common.NAMESPACE,
    discovery: str = common.DISCOVERY,
    host: str = typer.Option("127.0.0.1", help="Address to bind sockets on (and to publish)."),
    http_port: int = typer.Option(0, min=0, max=65535, help="/metrics and /health port."),
    booking_ttl: float = typer.Option(
        600.0, min=1.0, help="Seconds after which a booking never released is dropped."
    ),
    warm_up: float = typer.Option(
        5.0, min=0.0, help="Most seconds to learn workers and peers' bookings before serving."
    ),
    lease_ttl: float = common.LEASE_TTL,
    label: str = common.LABEL,
    *,
    settings: RouterSettings,
) -> None:
    """Route requests for every model of the namespace; frontends ask it, tokens bypass it.

    Run several for availability: they share their bookings and decide alike.
    """
    from dynamoctl.router.standalone.main import RouterOptions, run_router

    common.check_router_mode(settings)
    options = RouterOptions(
        namespace=namespace,
        discovery=discovery,
        host=host,
        lease_ttl=lease_ttl,
        label=label,
        router=settings,
        http_port=http_port,
        booking_ttl=booking_ttl,
        warm_up=warm_up,
    )
    common.run_component("router", namespace, run_router(options))
