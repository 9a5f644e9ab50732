"""The one start-up/shutdown sequence every component runs (dynamoctl/component/runtime.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from dynamoctl.component.runtime import ComponentRuntime, settle_heap_at_ready
from dynamoctl.settings import ComponentSettings
from dynamoctl.wire.records import Component, Endpoint


def _app() -> Starlette:
    return Starlette(routes=[Route("/metrics", lambda _: PlainTextResponse("ok"))])


async def test_lifecycle_records_signals_and_close_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    options = ComponentSettings(namespace="ns", discovery=f"embedded://{tmp_path}", label="x-0")
    runtime = ComponentRuntime(Component.ROUTER, options)
    runtime.serve_http(_app(), 0)
    order: list[str] = []
    seen: list[int] = []
    runtime.on_signal = seen.append

    async def closer(name: str) -> None:
        order.append(name)

    runtime.on_close(lambda: closer("first"))
    runtime.on_close(lambda: closer("second"))
    async with runtime:
        record = runtime.record(Endpoint.ROUTE, "tcp://127.0.0.1:1")
        assert (record.component, record.label, record.pid) == ("router", "x-0", os.getpid())
        assert record.metrics_url == runtime.metrics_url
        async with httpx.AsyncClient(trust_env=False) as http:  # HTTP serves once started
            assert (await http.get(str(runtime.metrics_url))).text == "ok"
        await runtime.register("ns/instances/router/route/a", record)
        assert await runtime.discovery.get("ns/instances/router/route/a") is not None
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(runtime.stop.wait(), 5)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.05)
        assert seen == [1, 2]
        await runtime.leave()
        assert await runtime.discovery.get("ns/instances/router/route/a") is None
    assert order == ["second", "first"]  # reverse of registration
    assert "router stopped" in caplog.text


async def test_leaving_an_unreachable_discovery_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = ComponentSettings(namespace="ns", discovery=f"embedded://{tmp_path}")
    runtime = ComponentRuntime(Component.FRONTEND, options)
    async with runtime:
        await runtime.register("ns/instances/frontend/http/a", runtime.record("http", "x"))

        async def unreachable(key: str) -> None:
            raise ConnectionError("etcd unreachable")

        runtime.discovery.unregister = unreachable  # type: ignore[method-assign]
        await runtime.leave()  # every component, the frontend too, gets past it
    assert "could not leave discovery (etcd unreachable)" in caplog.text


async def test_a_component_process_freezes_its_heap_once_at_its_first_record(
    tmp_path: Path,
) -> None:
    """What start-up made leaves the collector's generations when the process is ready,
    and only then: later records (and runtimes in a process that never asked) do not."""
    options = ComponentSettings(namespace="ns", discovery=f"embedded://{tmp_path}")
    try:
        async with ComponentRuntime(Component.ROUTER, options) as runtime:
            record = runtime.record(Endpoint.ROUTE, "tcp://127.0.0.1:1")
            await runtime.register("ns/instances/router/route/a", record)
            assert gc.get_freeze_count() == 0  # this test process never asked
            settle_heap_at_ready()
            await runtime.register("ns/instances/router/route/b", record)
            assert gc.get_freeze_count() > 1000
            gc.unfreeze()
            await runtime.register("ns/instances/router/route/c", record)
            assert gc.get_freeze_count() == 0  # once
    finally:
        gc.unfreeze()
