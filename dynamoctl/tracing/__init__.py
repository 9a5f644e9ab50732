"""OpenTelemetry traces of requests (docs/operations.md, "Traces").

Off unless a component's ``--otlp-endpoint`` (recipe ``tracing``) names a collector. Off
means free: this module imports no OpenTelemetry, no middleware is installed and the
worker's handler is not wrapped; the hooks on the request path are one context-variable
read that finds None. On, :func:`enable` builds the exporter (:mod:`.export`) and the
frontend's middleware sets :data:`TRACE` for each request it serves."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

from dynamoctl.settings.tracing import TracingSettings

if TYPE_CHECKING:
    from dynamoctl.tracing.spans import RequestTrace, Tracer

__all__ = ["TRACE", "enable"]

TRACE: ContextVar[RequestTrace | None] = ContextVar("dynamoctl_trace", default=None)
"""The trace of the request the current task serves (frontend); None when not traced."""


def enable(settings: TracingSettings, component: str, instance: str) -> Tracer | None:
    """This process's tracer, exporting to ``settings.endpoint``; None (and nothing
    imported) when no endpoint is set."""
    if settings.endpoint is None:
        return None
    try:
        from dynamoctl.tracing.export import start
    except ImportError as exc:
        raise RuntimeError(
            f"--otlp-endpoint needs OpenTelemetry ({exc}): pip install 'dynamoctl[tracing]'"
        ) from exc
    return start(settings, component, instance)
