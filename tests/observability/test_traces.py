"""Traces (docs/operations.md, "Traces"): a request through a real frontend and mocker
worker, each exporting by OTLP to a real collector (Arize Phoenix) started here, arrives
as one trace continuing the client's ``traceparent``, with the worker's spans under the
frontend's; and with tracing off nothing of OpenTelemetry is even imported."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.frontend.conftest import MODEL, Deployment
from tests.infra.phoenix import Collector, phoenix

pytestmark = pytest.mark.asyncio(loop_scope="module")

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ARRIVAL_S = 30.0
"""Spans are sent within 0.5 s of ending (``EXPORT_DELAY_MS``); the rest is load."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def traced(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[Deployment, Collector]]:
    tmp = Path(tmp_path_factory.mktemp("traces"))
    with phoenix(tmp) as collector:
        dep = Deployment(tmp)
        otlp = ("--otlp-endpoint", collector.url)
        try:
            dep.worker("--num-workers", "1", "--speedup-ratio", "20", *otlp)
            await dep.wait_for("worker", 1)
            await dep.start_frontend(*otlp)
            yield dep, collector
        finally:
            dep.stop()


async def whole_trace(collector: Collector, names: set[str]) -> dict[str, dict[str, Any]]:
    """The client's trace once every span in ``names`` arrived, by name."""
    deadline = time.monotonic() + ARRIVAL_S
    while True:
        spans = await asyncio.to_thread(collector.spans, CLIENT_TRACE)
        by_name = {s["name"]: s for s in spans}
        if names <= by_name.keys() or time.monotonic() > deadline:
            return by_name
        await asyncio.sleep(0.5)


async def test_request_is_one_trace_from_frontend_to_worker(
    traced: tuple[Deployment, Collector],
) -> None:
    dep, collector = traced
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 4, "ignore_eos": True, "stream": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{dep.frontend_url}/v1/chat/completions", json=body,
                               headers=headers)  # fmt: skip
        assert resp.status_code == 200, resp.text
    root_name = "POST /v1/chat/completions"
    frontend = {root_name, "parse", "tokenize", "route", "router.pick", "generate"}
    worker = {"worker.generate", "prefill", "decode"}
    spans = await whole_trace(collector, frontend | worker)
    assert frontend | worker <= spans.keys(), sorted(spans)

    def parent(name: str) -> str:
        return str(spans[name]["parent_id"])

    def span_id(name: str) -> str:
        return str(spans[name]["context"]["span_id"])

    assert parent(root_name) == CLIENT_SPAN  # the client's trace continues
    for name in ("parse", "tokenize", "route", "router.pick", "generate"):
        assert parent(name) == span_id(root_name), name
    # The worker's spans, from the other process, hang under the frontend's attempt.
    assert parent("worker.generate") == span_id("generate")
    assert parent("prefill") == parent("decode") == span_id("worker.generate")
    assert spans["prefill"]["end_time"] <= spans["decode"]["start_time"]


def test_tracing_off_imports_no_opentelemetry() -> None:
    """Off is free: the components' modules, a runtime and a worker instance built
    without an endpoint leave OpenTelemetry unimported."""
    probe = """
import sys
import dynamoctl.frontend.main, dynamoctl.worker.main
from dynamoctl.component.runtime import ComponentRuntime
from dynamoctl.settings import ComponentSettings
from dynamoctl.wire.records import Component
runtime = ComponentRuntime(Component.FRONTEND, ComponentSettings())
assert runtime.tracer is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
