"""Options and plumbing every long-running component command shares."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import typer

from dynamoctl.settings import RouterSettings, flag
from dynamoctl.util import aio
from dynamoctl.util import log as logsetup


def run_component(component: str, namespace: str, main: Coroutine[Any, Any, None]) -> None:
    """Log as ``[component/namespace]``, run ``main`` on uvloop (its heap frozen once
    ready: :func:`~dynamoctl.component.runtime.settle_heap_at_ready`), and turn a start-up
    failure (bad engine options, discovery unreachable, ...) into one line and exit 1."""
    from dynamoctl.component.runtime import settle_heap_at_ready  # the component's own

    logsetup.setup(f"{component}/{namespace}")
    settle_heap_at_ready()
    try:
        aio.run(main)
    except Exception as exc:
        typer.echo(f"dynamoctl {component}: {exc}", err=True)
        raise typer.Exit(1) from exc


def check_router_mode(settings: RouterSettings) -> None:
    """A mode the recipe schema knows but no policy implements is a usage error."""
    from dynamoctl.router.settings import check_mode

    try:
        check_mode(settings.mode)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag(RouterSettings, "mode")) from exc
