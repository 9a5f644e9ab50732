"""``dynamoctl worker``: run worker instances (an engine behind the request plane)."""

from __future__ import annotations

from typing import cast

import typer

from dynamoctl.cli import common
from dynamoctl.engines.registry import engine_names
from dynamoctl.worker.instance import Role
from dynamoctl.worker.options import parse_engine_args

ROLES = ("agg", "prefill", "decode")


def register(app: typer.Typer) -> None:
    app.command(
        "worker",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(worker)


def worker(
    ctx: typer.Context,
    engine: str = typer.Option("mocker", help="Engine adapter: " + ", ".join(engine_names())),
    role: str = typer.Option("agg", help="agg, prefill or decode."),
    namespace: str = common.NAMESPACE,
    discovery: str = common.DISCOVERY,
    host: str = typer.Option("127.0.0.1", help="Address to bind sockets on."),
    num_workers: int = typer.Option(1, min=1, help="Instances in this process."),
    http_port: int = typer.Option(0, min=0, max=65535, help="/metrics and /health port."),
    lease_ttl: float = common.LEASE_TTL,
    drain_grace: float = typer.Option(30.0, min=0.0, help="Seconds to finish in-flight work."),
    label: str = common.LABEL,
) -> None:
    """Run worker instances; extra --options are the engine's own arguments.

    Example: dynamoctl worker --engine mocker -n local --num-gpu-blocks 4096 --speedup-ratio 10
    """
    from dynamoctl.worker.main import WorkerOptions, run_worker

    if role not in ROLES:
        raise typer.BadParameter(f"must be one of {', '.join(ROLES)}, got {role!r}")
    if engine not in engine_names():
        raise typer.BadParameter(
            f"unknown engine {engine!r}; valid: {', '.join(engine_names())}", param_hint="--engine"
        )
    try:
        engine_options = parse_engine_args(ctx.args)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="engine arguments") from exc
    options = WorkerOptions(
        engine=engine,
        role=cast(Role, role),
        namespace=namespace,
        discovery=discovery,
        host=host,
        num_workers=num_workers,
        http_port=http_port,
        lease_ttl=lease_ttl,
        drain_grace=drain_grace,
        label=label,
        engine_options=engine_options,
    )
    common.run_component("worker", namespace, run_worker(options))
