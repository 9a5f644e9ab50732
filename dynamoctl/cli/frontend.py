"""``dynamoctl frontend``: the OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.settings import AdmissionSettings, DisaggSettings, RouterSettings, with_options


def register(app: typer.Typer) -> None:
    app.command("frontend")(
        with_options(
            frontend, settings=RouterSettings, disagg=DisaggSettings, admission=AdmissionSettings
        )
    )


def frontend(
    namespace: str = common.NAMESPACE,
    discovery: str = common.DISCOVERY,
    host: str = typer.Option("127.0.0.1", help="HTTP listen address."),
    port: int = typer.Option(8000, min=0, max=65535, help="HTTP port (0: any free port)."),
    router: str = typer.Option(
        "embedded",
        help="Where routing decisions are made: embedded (in this process) or standalone "
        "(ask the `dynamoctl router` replicas of the namespace; --router-mode and the "
        "weights are then theirs).",
    ),
    router_timeout: float = typer.Option(
        1.0, min=0.01, help="Standalone: seconds a router replica may take before the next."
    ),
    lease_ttl: float = common.LEASE_TTL,
    drain_grace: float = typer.Option(30.0, min=0.0, help="Seconds open streams get on stop."),
    label: str = common.LABEL,
    *,
    settings: RouterSettings,
    disagg: DisaggSettings,
    admission: AdmissionSettings,
) -> None:
    """Serve the OpenAI API for every model the namespace's workers serve."""
    from dynamoctl.frontend.main import FrontendOptions, run_frontend
    from dynamoctl.frontend.routing import routing_names

    if router not in routing_names():
        raise typer.BadParameter(
            f"must be one of {', '.join(routing_names())}, got {router!r}", param_hint="--router"
        )
    common.check_router_mode(settings)
    options = FrontendOptions(
        namespace=namespace,
        discovery=discovery,
        host=host,
        port=port,
        lease_ttl=lease_ttl,
        drain_grace=drain_grace,
        label=label,
        router=settings,
        disagg=disagg,
        admission=admission,
        routing=router,
        route_timeout=router_timeout,
    )
    common.run_component("frontend", namespace, run_frontend(options))
