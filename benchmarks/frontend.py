"""Frontend throughput and latency: 16-token streamed completions from 4 mocker workers.

    python benchmarks/frontend.py [--concurrency 1,8,32,128] [--seconds 5] [--out FILE]

Starts one worker process (4 mocker instances, speedup 1000) and one frontend on
127.0.0.1 with embedded discovery, then runs a closed loop at each concurrency: every
client sends a streamed completion (16 tokens, ignore_eos), reads it to ``[DONE]``, and
sends the next. Reports req/s, TTFT and end-to-end percentiles, and the CPU seconds the
frontend process used per request. The load generator shares the machine's 2 cores with
the frontend and workers, as a peer measured the same way would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from dynamoctl import wire
from dynamoctl.discovery import Discovery, store_from_url

NS = "bench"
MODEL = "mock-llama"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def frontend_url(url: str) -> str:
    async with Discovery(store_from_url(url), lease_ttl=2) as disc:
        for _ in range(300):
            found = await disc.list(f"{NS}/instances/frontend/")
            if found:
                return wire.decode_json(next(iter(found.values())), wire.InstanceRecord).address
            await asyncio.sleep(0.1)
    raise TimeoutError("frontend did not register")


async def stream_once(host: str, port: int, payload: bytes) -> tuple[float, float, bool]:
    """One streamed completion over a fresh keep-alive-less connection: (ttft, e2e, ok).

    A minimal HTTP/1.1 client (one write, TCP_NODELAY) rather than httpx: httpx's separate
    header and body writes meet delayed ACKs (~40 ms a request on Linux loopback), and its
    per-request Python cost would be measured instead of the frontend's.
    """
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
            + payload
        )  # fmt: skip
        status = await reader.readline()
        first: float | None = None
        done = False
        while line := await reader.readline():
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic()
            if line.startswith(b"data: [DONE]"):
                done = True
                break
        end = time.monotonic()
        return (first or end) - start, end - start, done and b" 200 " in status
    finally:
        writer.close()


async def one_level(base: str, concurrency: int, seconds: float) -> dict[str, float]:
    body = {"model": MODEL, "prompt": "benchmark prompt", "max_tokens": 16, "stream": True,
            "ignore_eos": True}  # fmt: skip
    payload = json.dumps(body).encode()
    host, port = base.removeprefix("http://").rsplit(":", 1)
    ttfts: list[float] = []
    e2es: list[float] = []
    errors = 0
    stop_at = time.monotonic() + seconds

    async def client() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            try:
                ttft, e2e, ok = await stream_once(host, int(port), payload)
            except OSError:
                errors += 1
                continue
            if not ok:
                errors += 1
                continue
            ttfts.append(ttft)
            e2es.append(e2e)

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.monotonic() - began
    return {
        "concurrency": concurrency,
        "requests": len(e2es),
        "errors": errors,
        "req_per_s": round(len(e2es) / wall, 1),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 2),
        "ttft_p99_ms": round(pct(ttfts, 0.99) * 1e3, 2),
        "e2e_p50_ms": round(statistics.median(e2es) * 1e3, 2),
        "e2e_p99_ms": round(pct(e2es, 0.99) * 1e3, 2),
    }


async def run(levels: list[int], seconds: float) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"embedded://{tmp}"
        common = ["--namespace", NS, "--discovery", url]
        worker_args = ["--num-workers", "4", "--model", MODEL, "--block-size", "16",
                       "--speedup-ratio", "1000"]  # fmt: skip
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dynamoctl", *args, *common, stderr=subprocess.DEVNULL
            )
            for args in (["worker", *worker_args], ["frontend", "--port", "0"])
        ]
        try:
            base = await frontend_url(url)
            async with httpx.AsyncClient() as http:  # wait until the model is served
                for _ in range(300):
                    if (await http.get(f"{base}/v1/models")).json()["data"]:
                        break
                    await asyncio.sleep(0.1)
            frontend = psutil.Process(procs[1].pid)
            rows = []
            for level in levels:
                cpu = frontend.cpu_times()
                row = await one_level(base, level, seconds)
                after = frontend.cpu_times()
                used = (after.user + after.system) - (cpu.user + cpu.system)
                row["frontend_cpu_ms_per_req"] = round(used * 1e3 / max(1, row["requests"]), 3)
                row["frontend_cpu_cores"] = round(used / seconds, 2)
                rows.append(row)
                print(
                    f"c={level:<4} {row['req_per_s']:>7} req/s  TTFT p50 {row['ttft_p50_ms']} ms "
                    f"p99 {row['ttft_p99_ms']} ms  e2e p50 {row['e2e_p50_ms']} ms "
                    f"p99 {row['e2e_p99_ms']} ms  frontend {row['frontend_cpu_cores']} cores  "
                    f"errors {row['errors']}"
                )
            return rows
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except asyncio.TimeoutError:
                    proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default="benchmarks/results/frontend.json")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = asyncio.run(run(levels, args.seconds))
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "workload": "streamed completions, 16 tokens, 4 mocker workers at speedup 1000",
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
