"""A worker killed at the exact moment between admission and first token (issue 26,
"nothing accepted is lost at a death"; docs/operations.md, "When a process dies"): the
request it had accepted is re-routed to the other worker and completes, with no error
event and every token asked for.

The moment is made, not hoped for: the worker runs the mocker's fault-injection knob
``hold-first-requests 1`` (docs/mocker.md, "Fault injection"), so the first request it
accepts is held before its first token for as long as the test wants; the test sees it
held in the worker's ``/health`` and SIGKILLs the worker then."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest

from dynamoctl.wire.health import WorkerHealth
from tests.frontend.conftest import BLOCK, BLOCKS, MODEL, Deployment
from tests.frontend.test_fast_death import migrations

MAX_TOKENS = 64


@pytest.fixture
async def held_and_free(tmp_path: Path) -> AsyncIterator[Deployment]:
    """Worker ``held`` (holds its first request) and worker ``free`` behind a frontend."""
    dep = Deployment(tmp_path)
    try:
        for name, knob in (("held", ["--hold-first-requests", "1"]), ("free", [])):
            dep.spawn(
                name, "worker", "--model", MODEL, "--block-size", str(BLOCK),
                "--num-gpu-blocks", str(BLOCKS), "--speedup-ratio", "10", *knob,
            )  # fmt: skip
        await dep.wait_for("worker", 2)
        await dep.start_frontend()
        yield dep
    finally:
        dep.stop()


async def stream(http: httpx.AsyncClient, url: str, prompt: str) -> tuple[list[dict], str]:
    """One streamed completion: its events, and the raw lines for the failure message."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events, raw = [], []
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            raw.append(line)
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events, "\n".join(raw)


async def inflight(http: httpx.AsyncClient, health_url: str) -> int:
    return msgspec.json.decode((await http.get(health_url)).content, type=WorkerHealth).inflight


async def test_a_request_whose_worker_dies_before_its_first_token_completes_elsewhere(
    held_and_free: Deployment,
) -> None:
    dep, url = held_and_free, held_and_free.frontend_url
    held_proc = dep.procs[0]  # spawned first
    held = next(r for r in await dep.records("worker") if r.pid == held_proc.pid)
    assert held.health_url is not None
    async with httpx.AsyncClient(timeout=60) as http:
        # Requests go one at a time until the router sends one to the holding worker:
        # those the free worker serves complete; the held one waits there, tokenless.
        for attempt in range(20):
            request = asyncio.create_task(stream(http, url, f"request {attempt} " * 20))
            while not request.done():
                if await inflight(http, held.health_url):
                    break
                await asyncio.sleep(0.02)
            else:
                events, raw = request.result()
                assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS, raw
                continue
            break
        else:
            pytest.fail("the router never picked the holding worker in 20 requests")
        await asyncio.sleep(0.5)  # held: still no token, still in flight on that worker
        assert not request.done() and await inflight(http, held.health_url) == 1
        assert await migrations(http, url) == 0

        held_proc.send_signal(signal.SIGKILL)
        held_proc.wait()
        events, raw = await asyncio.wait_for(request, 30)
        assert not any("error" in event for event in events), raw
        assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS, raw
        finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
        assert finishes[-1] == "length", raw
        assert await migrations(http, url) == 1
    log = (dep.tmp / "frontend.log").read_text()
    assert "migrating with 0 tokens" in log, log
