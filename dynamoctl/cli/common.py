"""Options and plumbing every long-running component command shares."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import typer

from dynamoctl.util import aio
from dynamoctl.util import log as logsetup

if TYPE_CHECKING:
    from dynamoctl.router.settings import RouterSettings

NAMESPACE = typer.Option("dynamo", "--namespace", "-n", help="Deployment namespace.")
DISCOVERY = typer.Option(
    "embedded", help="Discovery URL: embedded[://DIR] or etcd://HOST:PORT[,HOST:PORT]."
)
LEASE_TTL = typer.Option(10.0, min=2.0, help="Discovery lease TTL (s).")
# The routing knobs, shared by the embedded router (frontend) and `dynamoctl router`.
ROUTER_MODE = typer.Option("kv", help="Routing mode (kv, round-robin, ...).")
OVERLAP_WEIGHT = typer.Option(1.0, min=0.0, help="KV router prefill weight (alpha).")
TEMPERATURE = typer.Option(0.0, min=0.0, help="KV router softmax temperature.")
BUSY_KV_USAGE = typer.Option(
    0.95, min=0.0, max=1.0, help="A worker over this KV usage is busy (skipped)."
)
LABEL = typer.Option("", help="Name given by the supervisor (agg-0), kept in discovery records.")


def run_component(component: str, namespace: str, main: Coroutine[Any, Any, None]) -> None:
    """Log as ``[component/namespace]``, run ``main`` on uvloop, and turn a start-up
    failure (bad engine options, discovery unreachable, ...) into one line and exit 1."""
    logsetup.setup(f"{component}/{namespace}")
    try:
        aio.run(main)
    except Exception as exc:
        typer.echo(f"dynamoctl {component}: {exc}", err=True)
        raise typer.Exit(1) from exc


def router_settings(
    mode: str, overlap_weight: float, temperature: float, busy_kv_usage: float
) -> RouterSettings:
    """The routing knobs as settings, an unknown mode as a usage error."""
    from dynamoctl.router.settings import RouterSettings, check_mode

    try:
        check_mode(mode)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--router-mode") from exc
    return RouterSettings(mode, overlap_weight, temperature, busy_kv_usage)
