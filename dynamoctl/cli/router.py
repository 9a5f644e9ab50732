"""``dynamoctl router``: a standalone router replica, asked by ``frontend --router standalone``."""

from __future__ import annotations

import typer

from dynamoctl.cli import common


def register(app: typer.Typer) -> None:
    app.command("router")(router)


def router(
    namespace: str = common.NAMESPACE,
    discovery: str = common.DISCOVERY,
    host: str = typer.Option("127.0.0.1", help="Address to bind sockets on (and to publish)."),
    http_port: int = typer.Option(0, min=0, max=65535, help="/metrics and /health port."),
    router_mode: str = typer.Option("kv", help="Routing mode (kv, round-robin, ...)."),
    overlap_weight: float = typer.Option(1.0, min=0.0, help="KV router prefill weight (alpha)."),
    temperature: float = typer.Option(0.0, min=0.0, help="KV router softmax temperature."),
    busy_kv_usage: float = typer.Option(
        0.95, min=0.0, max=1.0, help="A worker over this KV usage is busy (skipped)."
    ),
    booking_ttl: float = typer.Option(
        600.0, min=1.0, help="Seconds after which a booking never released is dropped."
    ),
    warm_up: float = typer.Option(
        5.0, min=0.0, help="Most seconds to learn workers and peers' bookings before serving."
    ),
    lease_ttl: float = common.LEASE_TTL,
    label: str = common.LABEL,
) -> None:
    """Route requests for every model of the namespace; frontends ask it, tokens bypass it.

    Run several for availability: they share their bookings and decide alike.
    """
    from dynamoctl.router.settings import RouterSettings, check_mode
    from dynamoctl.router.standalone.main import RouterOptions, run_router

    try:
        check_mode(router_mode)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--router-mode") from exc
    options = RouterOptions(
        namespace=namespace,
        discovery=discovery,
        host=host,
        lease_ttl=lease_ttl,
        label=label,
        router=RouterSettings(router_mode, overlap_weight, temperature, busy_kv_usage),
        http_port=http_port,
        booking_ttl=booking_ttl,
        warm_up=warm_up,
    )
    common.run_component("router", namespace, run_router(options))
