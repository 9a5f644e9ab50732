"""The frontend's memory returns to its baseline after a burst of hostile requests (it
used to grow by hundreds of MB during fuzzing and stay there)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import psutil

from dynamoctl.frontend.app import MAX_BODY_BYTES
from tests.frontend.conftest import MODEL, Deployment
from tests.frontend.rawhttp import exchange, request
from tests.frontend.test_hardening import nested, words

MB = 1 << 20
ALLOWED_GROWTH = 60 * MB


def _bodies(text: str) -> list[bytes]:
    ids = json.dumps({"model": MODEL, "prompt": [1234] * (3 * MB // 6)}).encode()
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()
    return [
        *[ids] * 12,  # pre-tokenised prompts: ~500k ids each
        *[chat] * 6,  # text to tokenise: 1 MB each
        *[b'{"model": "%s", "prompt": "x", "user": %s}' % (MODEL.encode(), nested(5000).encode())]
        * 30,
        *[b'{"prompt": "' + b"x" * (5 * MB) + b'"}'] * 6,  # 413
        *[json.dumps({"model": MODEL, "prompt": "x", "seed": 2**70, "stream": True}).encode()] * 20,
    ]


async def _burst(url: str, text: str) -> list[int]:
    async def one(body: bytes, path: str) -> int:
        async with httpx.AsyncClient(timeout=120) as http:
            try:
                return (await http.post(f"{url}{path}", content=body)).status_code
            except httpx.TransportError:
                # A body past the limit is refused (413) and its connection closed while
                # the client may still be sending it: then the client sees only the close.
                return 0 if len(body) > MAX_BODY_BYTES else 600  # else a cut stream: a 5xx

    posts = [
        one(b, "/v1/chat/completions" if b'"messages"' in b else "/v1/completions")
        for b in _bodies(text)
    ]
    raw = [request("GET", "/v1/models", headers=[("X-Big", "a" * MB)])] * 10
    raw += [request("GET", "/v1/models", headers=[(f"X-{i}", "v") for i in range(20_000)])] * 4

    async def raw_one(data: bytes) -> int:
        try:
            return (await exchange(url, data)).status
        except (ConnectionError, asyncio.IncompleteReadError):
            return 0  # the server may close before reading everything: that is fine

    return list(await asyncio.gather(*posts, *map(raw_one, raw)))


def _rss(proc: psutil.Process) -> int:
    return int(proc.memory_info().rss)


async def test_rss_returns_to_baseline_after_hostile_burst(tmp_path: Path) -> None:
    dep = Deployment(tmp_path)
    try:
        dep.worker("--num-workers", "1", "--speedup-ratio", "50")
        await dep.wait_for("worker", 1)
        await dep.start_frontend()
        proc = psutil.Process(dep.procs[-1].pid)
        text = words(MB)
        async with httpx.AsyncClient(timeout=30) as http:  # warm up with good requests
            for n in range(10):
                body = {"model": MODEL, "prompt": words(1000 * n + 10), "max_tokens": 8}
                resp = await http.post(f"{dep.frontend_url}/v1/completions", json=body)
                assert resp.status_code == 200
        await asyncio.sleep(1)
        baseline = _rss(proc)
        peak = baseline
        for _ in range(2):
            statuses = await _burst(dep.frontend_url, text)
            peak = max(peak, _rss(proc))
            assert all(s < 500 for s in statuses), sorted(set(statuses))
        after = baseline + 10 * ALLOWED_GROWTH
        deadline = time.monotonic() + 5
        # A moment to finish and give memory back: no longer than it takes to get there.
        while time.monotonic() < deadline and after - baseline >= ALLOWED_GROWTH:
            await asyncio.sleep(0.5)
            after = min(after, _rss(proc))
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{dep.frontend_url}/health")).status_code == 200
        print(
            f"frontend RSS: baseline {baseline / MB:.0f} MB, peak during bursts >= "
            f"{peak / MB:.0f} MB, after {after / MB:.0f} MB ({(after - baseline) / MB:+.0f} MB)"
        )
        assert after - baseline < ALLOWED_GROWTH
    finally:
        dep.stop()
