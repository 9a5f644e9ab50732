"""Aggregated vs disaggregated prefill/decode on a mixed long-prompt / long-output load.

    python benchmarks/disagg.py [--requests 240] [--seconds 60] [--out FILE]

Two fresh deployments (``cluster.py``), each three mocker workers in their own processes
on the real clock (speedup 1: the engines' simulated step times, not this machine's CPU,
dominate): ``agg`` = 3 aggregated workers; ``disagg`` = 1 prefill + 2 decode workers
behind a frontend with ``--disaggregation auto --min-remote-prefill-tokens 512``. The
load is a closed loop of 12 requests at once, alternating *summaries* (2048-token
prompt, 16 output tokens) and *generations* (256-token prompt, 256 output tokens), no
prefix shared. In the aggregated deployment every long prompt's prefill chunks share
steps with the generations' decodes, stretching their inter-token latency; disaggregated,
long prompts are prefilled on the prefill worker and the decode workers only decode
(the short generation prompts stay local: below the threshold). Reported per deployment:
TTFT, ITL and end-to-end p50/p99, throughput, and the frontend's remote/local prefill counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
from cluster import MODEL, cluster
from machine import machine

from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.report import summary_table
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, Summary, summarize
from dynamoctl.bench.workload import Session, Turn, random_tokens

WORKER_ARGS = ["--num-gpu-blocks", "4096", "--speedup-ratio", "1", "--max-num-seqs", "64",
               "--max-num-batched-tokens", "2048"]  # fmt: skip
DEPLOYMENTS: dict[str, dict[str, Any]] = {
    "agg": {"roles": ["agg", "agg", "agg"], "frontend": []},
    "disagg": {
        "roles": ["prefill", "decode", "decode"],
        "frontend": ["--disaggregation", "auto", "--min-remote-prefill-tokens", "512"],
    },
}
WORKLOAD = {"concurrency": 12, "summaries": {"isl": 2048, "osl": 16},
            "generations": {"isl": 256, "osl": 256}, "ttft_slo_ms": 500.0,
            "itl_slo_ms": 30.0}  # fmt: skip


def mixed_sessions(seed: int = 1) -> Iterator[Session]:
    """Endless one-turn sessions, summaries and generations alternating."""
    rng = random.Random(seed)
    kinds = [WORKLOAD["summaries"], WORKLOAD["generations"]]
    index = 0
    while True:
        kind = kinds[index % 2]
        yield Session(index, [], [Turn(random_tokens(rng, kind["isl"]), kind["osl"])])
        index += 1


async def frontend_counts(url: str) -> dict[str, float]:
    """The frontend's disaggregation counters, by series."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    pattern = r"(dynamoctl_frontend_(?:remote_prefills|local_prefills|prefill_fallbacks)_total)"
    counts = {}
    for line in text.splitlines():
        m = re.match(pattern + r"(\{.*\})? (\S+)$", line)
        if m:
            counts[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return counts


async def one(name: str, requests: int, seconds: float) -> tuple[Summary, dict[str, float]]:
    spec = DEPLOYMENTS[name]
    async with cluster(per_process=1, worker_args=WORKER_ARGS, frontend_args=spec["frontend"],
                       process_args=[["--role", r] for r in spec["roles"]]) as dep:  # fmt: skip
        clock = LoopClock()
        sender = Sender(Endpoint(dep.url), MODEL, clock, timeout=60)
        outcome = await drive(mixed_sessions(), sender.send, clock=clock,
                              limits=Limits(requests, seconds, 30),
                              concurrency=int(WORKLOAD["concurrency"]))  # fmt: skip
        slo = Slo(ttft_ms=float(WORKLOAD["ttft_slo_ms"]), itl_ms=float(WORKLOAD["itl_slo_ms"]))
        summary = summarize(outcome, slo, label=name, concurrency=int(WORKLOAD["concurrency"]))
        return summary, await frontend_counts(dep.url)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deployments", default="agg,disagg")
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default="benchmarks/results/disagg.json")
    args = parser.parse_args()
    runs = []
    for name in args.deployments.split(","):
        summary, counts = asyncio.run(one(name, args.requests, args.seconds))
        runs.append((summary, counts))
        print(name, json.dumps(counts))
    print(summary_table([s for s, _ in runs]))
    result = {
        "machine": machine(),
        "deployments": {k: v["roles"] for k, v in DEPLOYMENTS.items()},
        "worker_args": WORKER_ARGS,
        "workload": WORKLOAD,
        "runs": [
            {
                "label": s.label,
                "completed": s.completed,
                "errors": s.errors,
                "duration_s": s.duration_s,
                "request_throughput": s.request_throughput,
                "output_token_throughput": s.output_token_throughput,
                "ttft_ms": msgspec.to_builtins(s.ttft_ms),
                "itl_ms": msgspec.to_builtins(s.itl_ms),
                "e2e_ms": msgspec.to_builtins(s.e2e_ms),
                "goodput_fraction": s.goodput_fraction,
                "frontend_counters": counts,
            }
            for s, counts in runs
        ],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
