"""Frontend throughput and latency: 16-token streamed completions from 4 mocker workers.

    python benchmarks/frontend.py [--concurrency 1,8,32,128] [--seconds 5] [--out FILE]

Starts one worker process (4 mocker instances, speedup 1000) and one frontend on
127.0.0.1 with embedded discovery (``cluster.py``), then runs ``dynamoctl bench``'s load
generator in a closed loop at each concurrency: every client sends a streamed completion
(4 prompt tokens, 16 output tokens, ignore_eos), reads it to ``[DONE]``, and sends the
next. Reports req/s, TTFT and end-to-end percentiles, and the CPU the frontend process
used. The load generator shares the machine's 2 cores with the frontend and workers, as a
peer measured the same way would. Its HTTP client writes each request in one write (see
``dynamoctl/bench/http.py``; ``benchmarks/http_clients.py`` compares it with httpx/aiohttp).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
from pathlib import Path
from typing import Any

from cluster import MODEL, cluster, cpu_seconds
from machine import machine

from dynamoctl import __version__
from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.result import BenchResult, RunResult
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.bench.workload import LengthDist, synthetic_sessions


async def run(levels: list[int], seconds: float) -> tuple[list[dict[str, Any]], list[RunResult]]:
    async with cluster(processes=1, per_process=4) as deployment:
        clock = LoopClock()
        sender = Sender(Endpoint(deployment.url), MODEL, clock, timeout=30)
        rows = []
        runs = []
        for level in levels:
            before = cpu_seconds(deployment.frontend)
            sessions = synthetic_sessions(LengthDist.parse("4"), LengthDist.parse("16"), seed=level)
            limits = Limits(max_requests=10**9, max_seconds=seconds, drain_seconds=10)
            outcome = await drive(sessions, sender.send, clock=clock, limits=limits,
                                  concurrency=level)  # fmt: skip
            used = cpu_seconds(deployment.frontend) - before
            s = summarize(outcome, Slo(), label=f"c={level}", concurrency=level)
            row = {
                "concurrency": level,
                "requests": s.completed,
                "errors": sum(s.errors.values()),
                "req_per_s": round(s.request_throughput, 1),
                "ttft_p50_ms": s.ttft_ms.p50,
                "ttft_p99_ms": s.ttft_ms.p99,
                "e2e_p50_ms": s.e2e_ms.p50,
                "e2e_p99_ms": s.e2e_ms.p99,
                "frontend_cpu_ms_per_req": round(used * 1e3 / max(1, s.completed), 3),
                "frontend_cpu_cores": round(used / s.duration_s, 2),
            }
            rows.append(row)
            runs.append(RunResult(s, outcome.records))
            print(
                f"c={level:<4} {row['req_per_s']:>7} req/s  TTFT p50 {row['ttft_p50_ms']} ms "
                f"p99 {row['ttft_p99_ms']} ms  e2e p50 {row['e2e_p50_ms']} ms "
                f"p99 {row['e2e_p99_ms']} ms  frontend {row['frontend_cpu_cores']} cores  "
                f"errors {row['errors']}"
            )
        return rows, runs


def plot(runs: list[RunResult], out: Path) -> None:
    from dynamoctl.bench.plots import latency_cdfs, throughput

    # Levels are bounded by time only, so the caption gives the seconds each one ran.
    workload = {"isl": 4, "osl": 16, "ignore_eos": True}
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    bench = BenchResult(version=__version__, started_at=started, endpoint="local", model=MODEL,
                        api="completions", workload=workload, runs=runs)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    print("wrote", throughput(bench, out / "frontend_throughput.png"),
          latency_cdfs(bench, out / "frontend_latency_cdf.png"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default="benchmarks/results/frontend.json")
    parser.add_argument("--plots", default="docs/img", help="where frontend_*.png go ('' none)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rows, runs = asyncio.run(run(levels, args.seconds))
    if args.plots:
        plot(runs, Path(args.plots))
    result = {
        "machine": machine(),
        "workload": "streamed completions, 4 prompt tokens, 16 output tokens (ignore_eos), "
        "4 mocker workers at speedup 1000; dynamoctl.bench closed loop",
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
