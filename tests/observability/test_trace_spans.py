"""The spans themselves, on the SDK's in-memory exporter: a refused pick and the wait
before the next one (``queue``), and a decode worker's wait for a prefill's KV named
``kv_transfer`` rather than ``prefill``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dynamoctl.tracing.spans import Tracer
from dynamoctl.wire import engine as wire_engine


def tracer() -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracer(provider), exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


class Busy(Exception):
    pass


@pytest.mark.asyncio
async def test_refused_pick_then_wait_is_a_queue_span() -> None:
    spans, exporter = tracer()
    trace = spans.request("POST /v1/completions", [])
    answers: list[object] = [Busy("every worker is busy"), "w1"]

    async def pick(*_: object) -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    traced = trace.picks(pick)

    async def admitted() -> object:
        try:
            return await traced()
        except Busy:
            return await traced()

    assert await trace.route(admitted()) == "w1"
    trace.end()
    found = by_name(exporter.get_finished_spans())
    assert len(found["router.pick"]) == 2
    assert found["router.pick"][0].attributes == {"dynamoctl.refused": "every worker is busy"}
    (queue,) = found["queue"]
    assert queue.start_time is not None and queue.end_time is not None
    refused_end, second_start = found["router.pick"][0].end_time, found["router.pick"][1].start_time
    assert refused_end is not None and second_start is not None
    assert refused_end <= queue.start_time <= queue.end_time <= second_start
    root = found["POST /v1/completions"][0].context
    assert root is not None
    for span in (*found["router.pick"], queue, *found["route"]):
        assert span.parent is not None and span.parent.span_id == root.span_id


@pytest.mark.asyncio
@pytest.mark.parametrize(("role", "params", "first"), [
    ("decode", {"remote": 1}, "kv_transfer"),
    ("agg", None, "prefill"),
])  # fmt: skip
async def test_worker_spans_name_the_wait_for_the_first_token(
    role: str, params: dict[str, int] | None, first: str
) -> None:
    spans, exporter = tracer()
    request = wire_engine.GenerateRequest("r-0", [1, 2, 3], 2, kv_transfer_params=params)
    seen: list[wire_engine.GenerateRequest] = []

    async def handler(body: bytes) -> AsyncIterator[bytes]:
        seen.append(wire_engine.decode_request(body))
        for _ in range(2):
            yield b"chunk"

    served = spans.serving(handler, role)
    assert [raw async for raw in served(wire_engine.encode(request))] == [b"chunk"] * 2
    found = by_name(exporter.get_finished_spans())
    (worker,) = found["worker.generate"]
    assert {first, "decode"} <= found.keys()
    assert ({"prefill", "kv_transfer"} - {first}).isdisjoint(found)
    assert worker.context is not None
    # The engine is handed the worker's own span as its parent (vLLM's trace_headers).
    assert seen[0].trace_context is not None
    assert f"{worker.context.span_id:016x}" in seen[0].trace_context
