"""``dynamoctl frontend``: the OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import typer

from dynamoctl.cli import common


def register(app: typer.Typer) -> None:
    app.command("frontend")(frontend)


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
    router_mode: str = common.ROUTER_MODE,
    overlap_weight: float = common.OVERLAP_WEIGHT,
    temperature: float = common.TEMPERATURE,
    busy_kv_usage: float = common.BUSY_KV_USAGE,
    disaggregation: str = typer.Option(
        "auto",
        help="With prefill workers: auto (remote prefill of long prompts, local while no "
        "prefill worker is alive), required (503 instead), off.",
    ),
    min_remote_prefill_tokens: int = typer.Option(
        256, min=0, help="Shorter uncached prompts are prefilled on their decode worker."
    ),
    queue_timeout: float = typer.Option(
        5.0, min=0.0, help="Seconds a request waits when all workers are busy, then 503."
    ),
    max_queued: int = typer.Option(256, min=0, help="Requests allowed to wait at once."),
    lease_ttl: float = common.LEASE_TTL,
    drain_grace: float = typer.Option(30.0, min=0.0, help="Seconds open streams get on stop."),
    label: str = common.LABEL,
) -> None:
    """Serve the OpenAI API for every model the namespace's workers serve."""
    from dynamoctl.frontend.disagg import DISAGG_MODES, DisaggSettings
    from dynamoctl.frontend.main import FrontendOptions, run_frontend
    from dynamoctl.frontend.routing import routing_names

    if router not in routing_names():
        raise typer.BadParameter(
            f"must be one of {', '.join(routing_names())}, got {router!r}", param_hint="--router"
        )
    settings = common.router_settings(router_mode, overlap_weight, temperature, busy_kv_usage)
    if disaggregation not in DISAGG_MODES:
        raise typer.BadParameter(
            f"must be one of {', '.join(DISAGG_MODES)}, got {disaggregation!r}",
            param_hint="--disaggregation",
        )
    disagg = DisaggSettings(disaggregation, min_remote_prefill_tokens)
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
        routing=router,
        route_timeout=router_timeout,
        queue_timeout=queue_timeout,
        max_queued=max_queued,
    )
    common.run_component("frontend", namespace, run_frontend(options))
