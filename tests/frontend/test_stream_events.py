"""What every streamed endpoint built on chat completions (Anthropic's Messages,
OpenAI's Responses) shares through ``pipeline.stream_events``: a client that hangs up
mid-stream cancels the generation on its worker and is counted; a stream whose worker
dies with none to resume it ends with the endpoint's own in-band error event."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.frontend.conftest import parsed_models
from tests.frontend.test_openai_api import worker_inflight

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio]

MODEL = "mt-plain"
LONG = 5000  # tokens: still generating when the client leaves or the worker dies
NO_EOS = ("--eos-distribution", "none")  # every stream runs to its max_tokens
BODIES: dict[str, dict[str, Any]] = {
    "/v1/messages": {"model": MODEL, "max_tokens": LONG, "stream": True,
                     "messages": [{"role": "user", "content": "go"}]},
    "/v1/responses": {"model": MODEL, "max_output_tokens": LONG, "stream": True,
                      "input": "go"},
}  # fmt: skip


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event in ``raw``."""
    events = []
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_client_that_hangs_up_cancels_the_generation(tmp_path: Path, path: str) -> None:
    async with parsed_models(tmp_path, [MODEL], worker_args=NO_EOS) as dep:
        async with (
            httpx.AsyncClient() as http,
            http.stream("POST", f"{dep.frontend_url}{path}", json=BODIES[path]) as resp,
        ):
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():  # streaming has started
                assert await worker_inflight(dep) == 1
                break
        deadline = time.monotonic() + 10
        while await worker_inflight(dep) != 0:
            assert time.monotonic() < deadline, "worker still generating for a gone client"
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{dep.frontend_url}/metrics")).text
        assert f'dynamoctl_frontend_cancellations_total{{model="{MODEL}"}} 1.0' in metrics


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_stream_that_loses_its_only_worker_ends_in_an_error_event(
    tmp_path: Path, path: str
) -> None:
    async with parsed_models(tmp_path, [MODEL], worker_args=NO_EOS) as dep:
        worker = dep.procs[0]
        raw = b""
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", f"{dep.frontend_url}{path}", json=BODIES[path]) as resp,
        ):
            assert resp.status_code == 200
            async for chunk in resp.aiter_bytes():
                if not raw:
                    worker.send_signal(signal.SIGKILL)  # mid-stream, nowhere to migrate
                raw += chunk
        events = sse_events(raw)
        name, data = events[-1]
        assert name == "error", events[-3:]
        if path == "/v1/messages":  # Anthropic's shape
            assert data["type"] == "error" and data["error"]["type"] == "overloaded_error"
            assert "none can resume it" in data["error"]["message"]
        else:  # OpenAI's
            assert data["type"] == "error" and data["code"] is None
            assert "none can resume it" in data["message"]
            numbers = [d["sequence_number"] for _, d in events]
            assert numbers == list(range(len(numbers)))
        assert not any(n in ("message_stop", "response.completed") for n, _ in events)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{dep.frontend_url}/metrics")).text
        assert 'status="503"' in metrics
