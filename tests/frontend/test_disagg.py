"""Disaggregated prefill/decode end to end: real mocker worker processes in roles prefill
and decode, real frontends (auto, off, required), embedded discovery."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dynamoctl.planes.request import RemoteError, RequestClient
from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire import kv_transfer
from dynamoctl.wire.engine import GenerateRequest
from tests.frontend.conftest import MODEL, Deployment

LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~400 tokens
MIN_REMOTE = "64"


async def frontend(dep: Deployment, label: str, *extra: str) -> str:
    """Start a frontend labelled ``label``; its URL once it lists the model."""
    dep.spawn(f"frontend-{label}", "frontend", "--port", "0", "--label", label, *extra)
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            found = [r.address for r in await dep.records("frontend") if r.label == label]
            if found and (await http.get(f"{found[0]}/v1/models")).json()["data"]:
                return found[0]
            await asyncio.sleep(0.1)
    pytest.fail(f"frontend {label} never listed the model (see {dep.tmp})")


async def worker_urls(dep: Deployment) -> dict[str, str]:
    """Role -> metrics URL (one worker per role)."""
    return {r.role: r.metrics_url or "" for r in await dep.records("worker")}


async def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the series ``name`` whose labels include ``labels``."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(url)).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


async def chat(url: str, text: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    """A streamed chat completion: (content, usage)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    content, usage = "", {}
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event["choices"]:
                content += choice["delta"].get("content") or ""
            usage = event.get("usage") or usage
    return content, usage


@pytest.fixture
async def pd(tmp_path: Path) -> AsyncIterator[tuple[Deployment, Any]]:
    """One prefill and one decode mocker worker (separate processes)."""
    dep = Deployment(tmp_path)
    try:
        prefill = dep.worker("--role", "prefill", "--speedup-ratio", "20")
        dep.worker("--role", "decode", "--speedup-ratio", "20")
        await dep.wait_for("worker", 2)
        yield dep, prefill
    finally:
        dep.stop()


async def test_remote_prefill_matches_aggregated_tokens_and_short_prompts_stay_local(
    pd: tuple[Deployment, Any],
) -> None:
    dep, _ = pd
    auto = await frontend(dep, "auto", "--min-remote-prefill-tokens", MIN_REMOTE)
    off = await frontend(dep, "off", "--disaggregation", "off")
    urls = await worker_urls(dep)
    fm = f"{auto}/metrics"

    text, usage = await chat(auto, LONG, seed=42, max_tokens=24, ignore_eos=True)
    assert usage["completion_tokens"] == 24
    assert await metric(fm, "dynamoctl_frontend_remote_prefills_total", model=MODEL) == 1
    # The prefill worker ran it with max_tokens 1; the decode worker got the hand-off and
    # computed only the last prompt token (over the pulled KV), no prefill.
    prefill_m, decode_m = urls["prefill"], urls["decode"]
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 1
    assert await metric(prefill_m, "dynamoctl_worker_output_tokens_total") == 1
    assert await metric(decode_m, "dynamoctl_worker_remote_prefilled_requests_total") == 1
    prompt = await metric(decode_m, "dynamoctl_worker_prompt_tokens_total")
    cached = await metric(decode_m, "dynamoctl_worker_cached_tokens_total")
    assert prompt == usage["prompt_tokens"] > 300 and prompt - cached == 1
    assert await metric(decode_m, "dynamoctl_worker_output_tokens_total") == 24

    # A follow-up with a new long tail: still remote (the decode worker caches only the
    # first prompt), and the prefill worker's cache hits are the request's usage.
    _, again = await chat(auto, LONG + "a new question " * 40, max_tokens=4, ignore_eos=True)
    assert again["prompt_tokens_details"]["cached_tokens"] >= 300
    assert await metric(fm, "dynamoctl_frontend_remote_prefills_total", model=MODEL) == 2
    # The first prompt again is cached on the decode worker: prefilled there (local).
    await chat(auto, LONG, max_tokens=4, ignore_eos=True)
    assert await metric(fm, "dynamoctl_frontend_local_prefills_total", reason="short") == 1

    # Aggregated (disaggregation off: the decode worker prefills): the same tokens.
    agg_text, agg_usage = await chat(off, LONG, seed=42, max_tokens=24, ignore_eos=True)
    assert agg_text == text and agg_usage["completion_tokens"] == 24
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 2  # untouched

    # A prompt below the threshold is prefilled on the decode worker.
    short, _ = await chat(auto, "hello there", max_tokens=4, ignore_eos=True)
    assert short
    assert await metric(fm, "dynamoctl_frontend_local_prefills_total", reason="short") == 2
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 2


async def test_bad_handoffs_fail_explicitly_and_a_dead_prefill_pool_falls_back_or_503(
    pd: tuple[Deployment, Any],
) -> None:
    dep, prefill = pd
    auto = await frontend(dep, "auto", "--min-remote-prefill-tokens", MIN_REMOTE)
    required = await frontend(dep, "req", "--disaggregation", "required",
                              "--min-remote-prefill-tokens", MIN_REMOTE)  # fmt: skip
    records = {r.role: r for r in await dep.records("worker")}
    client = RequestClient()
    try:
        # Pulling a transfer nobody pinned fails at once, naming it.
        pull = kv_transfer.encode(kv_transfer.KvPullRequest("no-such-transfer"))
        with pytest.raises(RemoteError, match="unknown or expired KV transfer"):
            async for _ in client.stream(records["prefill"].address, kv_transfer.KV_PULL, pull):
                pass
        # A decode request whose hand-off names it fails (KvTransferFailed), never hangs.
        bogus = {"transfer_id": "gone", "remote_address": records["prefill"].address,
                 "num_blocks": 1, "block_hashes": []}  # fmt: skip
        body = wire_engine.encode(GenerateRequest("x", [1, 2, 3], 4, kv_transfer_params=bogus))
        with pytest.raises(RemoteError, match="KvTransferFailed"):
            async with asyncio.timeout(20):
                async for _ in client.stream(records["decode"].address, "generate", body):
                    pass
    finally:
        await client.close()

    prefill.send_signal(signal.SIGKILL)
    prefill.wait()
    dep.procs.remove(prefill)
    # Right after the kill the prefill worker may still be listed: the frontend's prefill
    # attempt fails and it falls back; the client sees a normal completion either way.
    _, usage = await chat(auto, LONG, max_tokens=8, ignore_eos=True)
    assert usage["completion_tokens"] == 8
    deadline = time.monotonic() + 20  # the dead worker's lease (2 s) expires
    while "prefill" in {r.role for r in await dep.records("worker")}:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)  # the frontends' watches see it go
    _, usage = await chat(auto, LONG, max_tokens=8, ignore_eos=True)
    assert usage["completion_tokens"] == 8
    fm = f"{auto}/metrics"
    fallbacks = await metric(fm, "dynamoctl_frontend_prefill_fallbacks_total", model=MODEL)
    assert fallbacks == 2
    assert await metric(fm, "dynamoctl_frontend_prefill_fallbacks_total",
                        reason="no_prefill_worker") >= 1  # fmt: skip

    async with httpx.AsyncClient(timeout=30) as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}
        refused = await http.post(f"{required}/v1/chat/completions", json=body)
    assert refused.status_code == 503
    assert "no prefill worker is alive" in refused.text


async def test_an_expired_handoff_is_prefilled_locally_with_the_same_tokens(
    tmp_path: Path,
) -> None:
    dep = Deployment(tmp_path)
    try:
        # Pins expire after 1 ms: every decode's pull fails (KvTransferFailed).
        dep.worker("--role", "prefill", "--speedup-ratio", "20", "--kv-pin-ttl", "0.001")
        dep.worker("--role", "decode", "--speedup-ratio", "20")
        await dep.wait_for("worker", 2)
        auto = await frontend(dep, "auto", "--min-remote-prefill-tokens", MIN_REMOTE)
        off = await frontend(dep, "off", "--disaggregation", "off")
        text, usage = await chat(auto, LONG, seed=9, max_tokens=12, ignore_eos=True)
        assert usage["completion_tokens"] == 12
        fm = f"{auto}/metrics"
        assert await metric(fm, "dynamoctl_frontend_remote_prefills_total") == 1
        assert await metric(fm, "dynamoctl_frontend_prefill_fallbacks_total",
                            reason="handoff_failed") == 1  # fmt: skip
        assert await metric(fm, "dynamoctl_frontend_migrations_total") == 0
        agg_text, _ = await chat(off, LONG, seed=9, max_tokens=12, ignore_eos=True)
        assert text == agg_text
    finally:
        dep.stop()


async def test_standalone_router_serves_both_pools(pd: tuple[Deployment, Any]) -> None:
    dep, _ = pd
    dep.spawn("router", "router", "--warm-up", "1")
    await dep.wait_for("router", 1)
    (router,) = await dep.records("router")
    rm = router.metrics_url or ""
    auto = await frontend(dep, "sa", "--router", "standalone",
                          "--min-remote-prefill-tokens", MIN_REMOTE)  # fmt: skip
    required = await frontend(dep, "sr", "--router", "standalone", "--disaggregation",
                              "required", "--min-remote-prefill-tokens", MIN_REMOTE)  # fmt: skip
    off = await frontend(dep, "off", "--disaggregation", "off")
    urls = await worker_urls(dep)
    prefill_m, decode_m = urls["prefill"], urls["decode"]
    assert await metric(rm, "dynamoctl_router_workers", model=MODEL) == 1
    assert await metric(rm, "dynamoctl_router_prefill_workers", model=MODEL) == 1

    # The router picks the prefill worker, then the decode worker that pulls its KV.
    text, usage = await chat(auto, LONG, seed=42, max_tokens=24, ignore_eos=True)
    assert usage["completion_tokens"] == 24
    assert await metric(f"{auto}/metrics", "dynamoctl_frontend_remote_prefills_total") == 1
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 1
    assert await metric(decode_m, "dynamoctl_worker_remote_prefilled_requests_total") == 1
    agg_text, _ = await chat(off, LONG, seed=42, max_tokens=24, ignore_eos=True)
    assert agg_text == text

    # A short prompt stays on the decode worker, also where disaggregation is required.
    for url in (auto, required):
        await chat(url, "hello there", max_tokens=4, ignore_eos=True)
        assert await metric(f"{url}/metrics", "dynamoctl_frontend_local_prefills_total",
                            reason="short") == 1  # fmt: skip
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 1
    await chat(required, LONG + "a new question " * 40, max_tokens=4, ignore_eos=True)
    assert await metric(f"{required}/metrics", "dynamoctl_frontend_remote_prefills_total") == 1
    assert await metric(prefill_m, "dynamoctl_worker_requests_total") == 2
    assert await metric(decode_m, "dynamoctl_worker_remote_prefilled_requests_total") == 2

    # Every booking, prefill pool's included, was released in the pool that held it.
    deadline = time.monotonic() + 10
    while await metric(rm, "dynamoctl_router_bookings") or await metric(
        rm, "dynamoctl_router_booked_requests"
    ):
        assert time.monotonic() < deadline, "the router kept bookings of finished requests"
        await asyncio.sleep(0.1)
    routed = await metric(rm, "dynamoctl_router_picks_total", outcome="routed")
    assert routed == 2 * 3 + 2  # survey, prefill and decode picks; one per short prompt
