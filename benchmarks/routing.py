"""KV-aware routing against round-robin and random on a cache-bound multi-turn workload.

    python benchmarks/routing.py [--modes kv,round-robin,random] [--requests 360]
                                 [--out FILE] [--plots DIR]

For each mode, a fresh deployment (``cluster.py``): one worker process of 8 mocker
instances with small KV caches (512 blocks of 16 tokens each: 8192 tokens) on the real
clock (speedup 1, so the engines' simulated prefill and decode times, not this machine's
CPU, dominate the latencies), and a frontend with ``--router-mode MODE``. The load is
``dynamoctl bench``'s closed loop: 24 conversations at once, each 4 turns of 256 new
tokens and 64 output tokens after one of 8 shared 1024-token system prompts; the history
is resent every turn. Every worker could hold every system prompt, but not every
conversation: routing decides how much of each prompt is already cached, which shows as
prefix hit rate, TTFT and (preemptions when blocks run out) TPOT. Goodput: TTFT <= 100 ms
and TPOT <= 30 ms.
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
from dynamoctl.bench.report import summary_table
from dynamoctl.bench.result import BenchResult, RunResult
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.bench.workload import LengthDist, synthetic_sessions

WORKERS = 8
WORKER_ARGS = ["--num-gpu-blocks", "512", "--speedup-ratio", "1", "--max-num-seqs", "64"]
WORKLOAD = {"concurrency": 24, "turns": 4, "isl": 256, "osl": 64, "shared_prefix": 1024,
            "prefix_groups": 8, "ttft_slo_ms": 100.0, "itl_slo_ms": 30.0}  # fmt: skip


async def one_mode(mode: str, requests: int, seconds: float, frontends: int = 1) -> RunResult:
    async with cluster(processes=1, per_process=WORKERS, worker_args=WORKER_ARGS,
                       router_mode=mode, frontends=frontends) as deployment:  # fmt: skip
        clock = LoopClock()
        sender = Sender(Endpoint(deployment.url), MODEL, clock, timeout=60)
        sessions = synthetic_sessions(
            LengthDist.parse(str(WORKLOAD["isl"])),
            LengthDist.parse(str(WORKLOAD["osl"])),
            turns=int(WORKLOAD["turns"]),
            shared_prefix=int(WORKLOAD["shared_prefix"]),
            prefix_groups=int(WORKLOAD["prefix_groups"]),
            seed=1,
        )
        before = cpu_seconds(deployment.frontend)
        outcome = await drive(sessions, sender.send, clock=clock,
                              limits=Limits(requests, seconds, 30),
                              concurrency=int(WORKLOAD["concurrency"]))  # fmt: skip
        used = cpu_seconds(deployment.frontend) - before
        slo = Slo(ttft_ms=float(WORKLOAD["ttft_slo_ms"]), itl_ms=float(WORKLOAD["itl_slo_ms"]))
        summary = summarize(outcome, slo, label=mode, concurrency=int(WORKLOAD["concurrency"]))
        print(f"{mode}: frontend {used / summary.duration_s:.2f} cores")
        return RunResult(summary, outcome.records)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="kv,round-robin,random")
    parser.add_argument("--requests", type=int, default=360)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--out", default="benchmarks/results/routing.json")
    parser.add_argument("--plots", default="docs/img", help="where routing_*.png go ('' none)")
    args = parser.parse_args()
    runs = [asyncio.run(one_mode(m, args.requests, args.seconds)) for m in args.modes.split(",")]
    summaries = [run.summary for run in runs]
    print(summary_table(summaries))
    result: dict[str, Any] = {
        "machine": machine(),
        "deployment": f"1 worker process x {WORKERS} mocker instances ({' '.join(WORKER_ARGS)}, "
        "block 16), 1 frontend per mode",
        "workload": WORKLOAD,
        "runs": [json.loads(json.dumps(s, default=_plain)) for s in summaries],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if args.plots:
        from dynamoctl.bench.plots import latency_cdfs, ttft_over_time

        bench = BenchResult(
            version=__version__,
            started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            endpoint="local", model=MODEL, api="completions", runs=runs,
            workload={**WORKLOAD, "limits": {"max_requests": args.requests,
                                             "max_seconds": args.seconds},
                      "slo": {"ttft_ms": WORKLOAD["ttft_slo_ms"],
                              "itl_ms": WORKLOAD["itl_slo_ms"]}},
        )  # fmt: skip
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        print("wrote", latency_cdfs(bench, Path(args.plots) / "routing_latency_cdf.png"),
              ttft_over_time(bench, Path(args.plots) / "routing_ttft_over_time.png"))  # fmt: skip


def _plain(obj: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(obj)


if __name__ == "__main__":
    main()
