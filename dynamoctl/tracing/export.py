"""The OpenTelemetry SDK's tracer provider with its OTLP exporter: imported only when
tracing is on (:func:`dynamoctl.tracing.enable`)."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from dynamoctl.settings.tracing import TracingSettings
from dynamoctl.tracing.spans import Tracer

EXPORT_DELAY_MS = 500
"""Spans are batched and sent at most this long after they end (the SDK's default is 5 s:
too long for an operator looking at the request they just made)."""


def _exporter(settings: TracingSettings) -> SpanExporter:
    endpoint = settings.endpoint
    assert endpoint is not None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        host = endpoint.split("://", 1)[-1]
        return GrpcExporter(endpoint=host, insecure=endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


def start(settings: TracingSettings, component: str, instance: str) -> Tracer:
    """A tracer for ``component`` (``frontend``, ``worker``) whose spans go to the
    collector in batches. Its own provider, not the global one: an engine in the same
    process (vLLM) configures its own tracing."""
    resource = Resource.create(
        {
            "service.name": f"{settings.service_name}-{component}",
            "service.instance.id": instance,
        }
    )
    sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    processor = BatchSpanProcessor(_exporter(settings), schedule_delay_millis=EXPORT_DELAY_MS)
    provider.add_span_processor(processor)
    return Tracer(provider)
