"""Which asyncio HTTP client to measure with: dynamoctl.bench's one-write client, httpx, aiohttp.

    python benchmarks/http_clients.py [--requests 300] [--out FILE]
    # aiohttp is not a dependency; to include it, run from a venv that has it:
    python -m venv --system-site-packages /tmp/aiohttp-venv
    /tmp/aiohttp-venv/bin/pip install aiohttp
    /tmp/aiohttp-venv/bin/python benchmarks/http_clients.py

Starts one worker process (4 mocker instances, speedup 1000) and a frontend
(``cluster.py``), then sends the same streamed 16-token completion with each client,
sequentially (c=1: the client's added latency) and 32 at a time (its throughput cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from cluster import MODEL, cluster

from dynamoctl.bench.http import Endpoint, post_sse
from dynamoctl.bench.stats import percentile

BODY = {"model": MODEL, "prompt": [1000, 1001, 1002, 1003], "max_tokens": 16, "stream": True,
        "ignore_eos": True}  # fmt: skip
PAYLOAD = json.dumps(BODY).encode()
Once = Callable[[], Awaitable[None]]


def raw_client(url: str, keep_alive: bool = True) -> tuple[Once, Callable[[], Awaitable[None]]]:
    endpoint = Endpoint(url, keep_alive=keep_alive)

    async def once() -> None:
        async for _ in post_sse(endpoint, "/v1/completions", PAYLOAD):
            pass  # to the body's end (past [DONE]), so the connection is reused

    return once, endpoint.close


def raw_client_no_keep_alive(url: str) -> tuple[Once, Callable[[], Awaitable[None]]]:
    return raw_client(url, keep_alive=False)


def httpx_client(url: str) -> tuple[Once, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(base_url=url, timeout=30)

    async def once() -> None:
        async with client.stream("POST", "/v1/completions", content=PAYLOAD,
                                 headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            async for line in resp.aiter_lines():
                if line.startswith("data: [DONE]"):
                    break

    return once, client.aclose


def aiohttp_client(url: str) -> tuple[Once, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(base_url=url)

    async def once() -> None:
        async with session.post("/v1/completions", data=PAYLOAD,
                                headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    break

    return once, session.close


async def measure(once: Once, requests: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            await once()
            latencies.append(time.perf_counter() - t0)

    for _ in range(5):  # warm up connections
        await once()
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "p50_ms": round(percentile(ordered, 0.5) * 1e3, 2),
        "p99_ms": round(percentile(ordered, 0.99) * 1e3, 2),
        "req_per_s": round(len(ordered) / wall, 1),
    }


async def run(requests: int) -> dict[str, Any]:
    clients: dict[str, Callable[[str], tuple[Once, Callable[[], Awaitable[None]]]]] = {
        "dynamoctl.bench (one write, keep-alive)": raw_client,
        "dynamoctl.bench (one write, new connection each)": raw_client_no_keep_alive,
        "httpx (pooled keep-alive)": httpx_client,
    }
    try:
        import aiohttp  # noqa: F401

        clients["aiohttp (pooled keep-alive)"] = aiohttp_client
    except ImportError:
        print("aiohttp not installed: skipped (see the docstring)")
    results: dict[str, Any] = {}
    async with cluster(processes=1, per_process=4) as deployment:
        for name, make in clients.items():
            once, close = make(deployment.url)
            try:
                results[name] = {f"c={c}": await measure(once, requests, c) for c in (1, 32)}
            finally:
                await close()
            print(name, results[name])
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", default="benchmarks/results/http_clients.json")
    args = parser.parse_args()
    rows = asyncio.run(run(args.requests))
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "workload": "streamed completion, 4 prompt tokens, 16 output tokens, 4 mocker workers "
        "at speedup 1000; latency per request, sequential (c=1) and 32 at a time",
        "clients": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
