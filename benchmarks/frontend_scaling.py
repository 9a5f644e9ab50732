"""Requests per second of N frontend processes on one port against one frontend (issue 24,
item 2: the goal is >= 0.8 N times one's).

    python benchmarks/frontend_scaling.py [--frontends 2] [--concurrency 64] [--seconds 10]
        [--rounds 3] [--loaders 2] [--unshared] [--out benchmarks/results/frontend_scaling.json]

Each arm is a fresh deployment (benchmarks/cluster.py): one worker process of 4 mocker
instances at speedup 1000 and 1 or N frontends (``--reuse-port --share-bookings``, as
``frontend.processes: N`` runs them) with KV routing. The load is dynamo_compare.py's
short workload (streamed 16-token completions, a new connection a request) from
``--loaders`` processes of its raw client, the concurrency split between them, so that
one Python load generator is not the ceiling. Arms alternate within each round, the
first arm going first in even rounds. Reported per run: req/s, latency percentiles, and
the CPU of all frontends together (per request and in cores). On a machine with as many
cores as frontends plus load, the req/s ratio is the scaling; on the 2-core development
machine the load generator and the workers share the frontends' cores, so the ratio is
bounded by the machine, and the frontends' CPU per request (one against N sharing
bookings) says what N processes cost beyond one. ``--unshared`` adds an arm of N frontends
that do not share bookings (``--reuse-port`` only): N against N unshared is what the
sharing costs, N unshared against one what each process repeats of the other's work
(every worker's KV events and load indexed by every router).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cluster import cluster
from machine import machine

HERE = Path(__file__).resolve().parent


def run_load(port: int, concurrency: int, seconds: float, loaders: int) -> dict[str, Any]:
    """``loaders`` processes of dynamo_compare's load at ``concurrency`` in all."""
    shares = [concurrency // loaders + (i < concurrency % loaders) for i in range(loaders)]
    code = (
        "import asyncio,json,sys,dynamo_compare as d;"
        "print(json.dumps(asyncio.run(d.load(*map(int,sys.argv[1:3]),float(sys.argv[3]),"
        "'short'))))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(port), str(c), str(seconds)],
            cwd=HERE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in shares
        if c
    ]
    rows = [json.loads(p.communicate()[0]) for p in procs]
    return {
        "requests": sum(r["requests"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "req_per_s": round(sum(r["req_per_s"] for r in rows), 1),
        # the loaders' percentiles, the worst of them
        "ttft_p99_ms": max(r["ttft_p99_ms"] for r in rows),
        "e2e_p50_ms": max(r["e2e_p50_ms"] for r in rows),
        "e2e_p99_ms": max(r["e2e_p99_ms"] for r in rows),
    }


async def one_arm(arm: str, concurrency: int, seconds: float, loaders: int) -> dict[str, Any]:
    frontends, _, unshared = arm.partition("-")
    async with cluster(
        processes=1, per_process=4, frontends=int(frontends), share_bookings=not unshared
    ) as deployment:
        port = urlparse(deployment.url).port or 80
        procs = deployment.frontends or [deployment.frontend]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, run_load, port, 8, 2.0, loaders)  # warm-up, dropped

        def cpu() -> float:
            return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

        before = cpu()
        row = await loop.run_in_executor(None, run_load, port, concurrency, seconds, loaders)
        used = cpu() - before  # the loaders' start-up adds ~1 s of idle frontends to this
    row["frontends"] = arm
    row["frontends_cpu_cores"] = round(used / seconds, 2)
    row["frontends_cpu_ms_per_req"] = round(used * 1e3 / max(1, row["requests"]), 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--unshared", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/frontend_scaling.json")
    args = parser.parse_args()
    arms: dict[str, list[dict[str, Any]]] = {"1": [], str(args.frontends): []}
    if args.unshared:
        arms[f"{args.frontends}-unshared"] = []
    load_before = machine()["loadavg"]
    for round_ in range(args.rounds):
        order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
        for arm in order:
            row = asyncio.run(one_arm(arm, args.concurrency, args.seconds, args.loaders))
            arms[arm].append(row)
            print(f"round {round_} {arm} frontend(s): {row}", flush=True)
    n = str(args.frontends)
    median = {arm: {k: statistics.median(r[k] for r in rows)
                    for k in ("req_per_s", "frontends_cpu_ms_per_req", "frontends_cpu_cores")}
              for arm, rows in arms.items()}  # fmt: skip
    result = {
        "machine": machine(),
        "load_average_before": load_before,
        "deployment": "1 worker process x 4 mocker instances (speedup 1000, block 16), "
        "kv routing; N frontends with --reuse-port --share-bookings (N-unshared: "
        "--reuse-port only)",
        "workload": "dynamo_compare.py's short workload: streamed 16-token completions, "
        f"closed loop, concurrency {args.concurrency} from {args.loaders} load processes, "
        f"{args.seconds} s a run",
        "runs": arms,
        "median": median,
        "req_per_s_ratio": round(median[n]["req_per_s"] / max(median["1"]["req_per_s"], 1e-9), 2),
        "goal_req_per_s_ratio": round(0.8 * args.frontends, 2),
        "load_average_after": machine()["loadavg"],
        "cpu_per_req_ratio": round(
            median[n]["frontends_cpu_ms_per_req"]
            / max(median["1"]["frontends_cpu_ms_per_req"], 1e-9),
            2,
        ),
    }
    if args.unshared:
        result["cpu_per_req_ratio_unshared"] = round(
            median[f"{n}-unshared"]["frontends_cpu_ms_per_req"]
            / max(median["1"]["frontends_cpu_ms_per_req"], 1e-9),
            2,
        )
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median", "req_per_s_ratio", "cpu_per_req_ratio")}))


if __name__ == "__main__":
    main()
