"""Distributed traces, declared once: the recipe's ``tracing`` section and every
component's ``--otlp-*`` flags (docs/operations.md, "Traces"). Absent or without an
endpoint, tracing is off: no OpenTelemetry import, no per-request work."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from dynamoctl.settings.base import Options

OtlpProtocol = Literal["http/protobuf", "grpc"]


class TracingSettings(Options):
    """Where a component sends its OpenTelemetry spans, and how many."""

    FLAGS: ClassVar[dict[str, str]] = {
        "endpoint": "otlp-endpoint",
        "protocol": "otlp-protocol",
        "sample_ratio": "otlp-sample-ratio",
        "service_name": "otlp-service-name",
    }

    endpoint: str | None = None
    """The OTLP collector's URL: ``http://HOST:4318`` for ``http/protobuf`` (spans are
    posted to ``/v1/traces`` under it), ``http://HOST:4317`` for ``grpc``. Unset: no
    traces (the default)."""
    protocol: OtlpProtocol = "http/protobuf"
    """OTLP transport: ``http/protobuf`` or ``grpc``."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of new traces recorded (by trace id, so every component keeps or drops the
    same ones). A request whose ``traceparent`` header says sampled or not is kept or
    dropped as its caller decided."""
    service_name: str = Field(default="dynamoctl", min_length=1)
    """Prefix of each component's ``service.name``: ``dynamoctl-frontend``,
    ``dynamoctl-worker``, ``dynamoctl-router``; ``service.instance.id`` is the process's
    label (``agg-0``)."""
