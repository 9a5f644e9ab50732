"""Chaos: SIGKILL a worker every ~15 s under closed-loop load, and see what clients notice.

    python benchmarks/chaos.py [--seconds 60] [--kill-every 15] [--concurrency 16]
                               [--out benchmarks/results/chaos.json]

``dynamoctl up`` of a local recipe (4 mocker workers, the shipped recipe's engine and
supervision settings) in a private ``DYNAMOCTL_HOME``, then ``dynamoctl bench``'s closed
loop for ``--seconds``; every ``--kill-every`` seconds one worker process (agg-0, agg-1,
... in turn) gets SIGKILL. Reports requests, errors by kind (the frontend migrates broken
streams, so there should be none), migrations (frontend metric), restarts (supervisor
metric), seconds from each kill to the supervisor seeing the replacement READY, and
throughput in 5 s windows before, during and after each kill. Bounded: the load stops at
``--seconds``, open requests get 30 s, then ``dynamoctl down``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from probes import MODEL, mocker_recipe
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl.bench.client import RequestRecord, Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.bench.workload import LengthDist, synthetic_sessions

NAME = "chaos"
WORKERS = 4
WINDOW = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dynamoctl(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DYNAMOCTL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def scrape(http: httpx.AsyncClient, url: str, name: str) -> dict[str, float]:
    """Samples of ``name`` by their labels (``k=v,...``)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families((await http.get(url)).text):
        for s in family.samples:
            if s.name == name:
                found[",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))] = s.value
    return found


class Chaos:
    def __init__(self, control: str, token: str, clock: LoopClock) -> None:
        self.http = httpx.AsyncClient(
            base_url=control,
            trust_env=False,
            timeout=10,
            headers={"authorization": f"Bearer {token}"},
        )
        self.clock = clock
        self.kills: list[dict[str, Any]] = []

    async def row(self, name: str) -> dict[str, Any]:
        rows = (await self.http.get("/status")).json()["instances"]
        return next(r for r in rows if r["name"] == name)  # type: ignore[no-any-return]

    async def kill_and_wait(self, victim: str, origin: float, timeout: float = 60) -> None:
        before = await self.row(victim)
        worker = psutil.Process(before["pid"]).children()[0]  # the keeper's child
        os.kill(worker.pid, signal.SIGKILL)
        killed = self.clock.now()
        kill: dict[str, Any] = {"instance": victim, "at_s": round(killed - origin, 3)}
        self.kills.append(kill)
        while self.clock.now() - killed < timeout:
            row = await self.row(victim)
            if row["state"] == "READY" and row["restarts"] > before["restarts"]:
                kill["replacement_ready_s"] = round(self.clock.now() - killed, 3)
                kill["last_exit"] = row["last_exit"]
                return
            await asyncio.sleep(0.05)
        kill["replacement_ready_s"] = None  # not back within the timeout

    async def run(self, origin: float, every: float, seconds: float) -> None:
        n = 0
        while (due := origin + every * (n + 1)) < origin + seconds - 1:
            await asyncio.sleep(max(0.0, due - self.clock.now()))
            await self.kill_and_wait(f"agg-{n % WORKERS}", origin)
            n += 1


def windows(records: list[RequestRecord], start: float, end: float) -> dict[str, float]:
    """Completions per second, output tokens per second, and errors in [start, end)."""
    ok = [
        r
        for r in records
        if r.error is None and r.e2e is not None and start <= r.start + r.e2e < end
    ]
    errors = sum(1 for r in records if r.error is not None and start <= r.start < end)
    span = end - start
    return {
        "from_s": round(start, 1),
        "req_per_s": round(len(ok) / span, 1),
        "output_tok_per_s": round(sum(r.output_tokens for r in ok) / span, 1),
        "errors": errors,
    }


async def load_and_kill(
    args: argparse.Namespace, url: str, control: str, token: str, supervisor_metrics: str
) -> dict[str, Any]:
    clock = LoopClock()
    endpoint = Endpoint(url)
    sender = Sender(endpoint, MODEL, clock, timeout=60)
    sessions = synthetic_sessions(
        LengthDist.parse(str(args.isl)), LengthDist.parse(str(args.osl)), seed=7
    )
    chaos = Chaos(control, token, clock)
    http = httpx.AsyncClient(trust_env=False, timeout=10)
    frontend_metrics = f"{url}/metrics"
    migrations = "dynamoctl_frontend_migrations_total"
    migrated_before = sum((await scrape(http, frontend_metrics, migrations)).values())
    origin = clock.now()
    killer = asyncio.create_task(chaos.run(origin, args.kill_every, args.seconds))
    outcome = await drive(
        sessions,
        sender.send,
        clock=clock,
        concurrency=args.concurrency,
        limits=Limits(10**9, args.seconds, 30),
    )
    await killer
    await endpoint.close()
    migrated = sum((await scrape(http, frontend_metrics, migrations)).values()) - migrated_before
    restarts = await scrape(http, supervisor_metrics, "dynamoctl_supervisor_restarts_total")
    await http.aclose()
    await chaos.http.aclose()
    summary = summarize(outcome, Slo(), label="chaos", concurrency=args.concurrency)
    records = outcome.records
    ready = [k["replacement_ready_s"] for k in chaos.kills if k["replacement_ready_s"]]
    for kill in chaos.kills:
        t = kill["at_s"]
        kill["windows"] = {
            name: windows(records, t + lo, t + lo + WINDOW)
            for name, lo in (("before", -WINDOW), ("after", 0.0), ("next", WINDOW))
        }
    return {
        "requests_total": len(records) + outcome.unfinished,
        "completed": summary.completed,
        "errors_by_kind": summary.errors,
        "error_details": sorted({f"{r.error}: {r.detail}" for r in records if r.error})[:10],
        "frontend_migrations": migrated,
        "supervisor_restarts": {k: v for k, v in restarts.items() if v},
        "kills": chaos.kills,
        "kill_to_ready_s": {"min": min(ready, default=None), "max": max(ready, default=None)},
        "throughput": {
            "req_per_s": round(summary.request_throughput, 1),
            "output_tok_per_s": round(summary.output_token_throughput, 1),
        },
        "timeline_5s": [
            windows(records, lo, lo + WINDOW) for lo in range(0, int(args.seconds), int(WINDOW))
        ],
        "ttft_ms": {"p50": summary.ttft_ms.p50, "p99": summary.ttft_ms.p99},
        "connections_opened": endpoint.opened,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--isl", type=int, default=512)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--out", default="benchmarks/results/chaos.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynamoctl-chaos-") as tmp:
        home, port = Path(tmp) / "home", free_port()
        recipe = Path(tmp) / "chaos.yaml"
        recipe.write_text(mocker_recipe(NAME, port, WORKERS, 10))
        began = time.monotonic()
        up = dynamoctl(home, "up", str(recipe), "--detach")
        if up.returncode != 0:
            sys.exit(f"up failed:\n{up.stderr}")
        print(f"up in {time.monotonic() - began:.1f} s", flush=True)
        try:
            state = json.loads((home / "runs" / NAME / "state.json").read_text())
            found = asyncio.run(
                load_and_kill(
                    args,
                    f"http://127.0.0.1:{port}",
                    state["control"],
                    state["token"],
                    f"{state['control']}/metrics",
                )
            )
        finally:
            down = dynamoctl(home, "down", NAME)
            if down.returncode != 0:
                print(down.stderr, file=sys.stderr)
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "deployment": f"dynamoctl up (local): {WORKERS} mocker workers (speedup 10, 4096 "
        "blocks of 16), kv router, shipped supervision defaults",
        "workload": {
            "concurrency": args.concurrency,
            "isl": args.isl,
            "osl": args.osl,
            "seconds": args.seconds,
            "kill_every_s": args.kill_every,
        },
        **found,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("kills", "timeline_5s")}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
