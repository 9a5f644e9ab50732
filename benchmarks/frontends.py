"""Routing quality of several frontend processes sharing bookings against one frontend,
on ``routing.py``'s workload (8 mocker instances with small caches, 24 multi-turn
conversations over 8 shared system prompts, ``kv`` mode).

    python benchmarks/frontends.py [--frontends 4] [--rounds 1] [--requests 360]
                                   [--out benchmarks/results/frontends.json]

Arms alternate within each round (1 frontend, then N on one port with ``--reuse-port
--share-bookings``), each on a fresh deployment. The goal (issue 24): the prefix hit rate
with N frontends within 2 points of one frontend's. Connections spread over the N
processes by the kernel; each process routes with its own router, fed by every worker's
KV events and by the other processes' bookings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from machine import machine
from routing import WORKER_ARGS, WORKERS, WORKLOAD, one_mode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frontends", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=360)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--out", default="benchmarks/results/frontends.json")
    args = parser.parse_args()
    arms: dict[str, list[dict[str, Any]]] = {"1": [], str(args.frontends): []}
    for _ in range(args.rounds):
        for arm in arms:
            run = asyncio.run(one_mode("kv", args.requests, args.seconds, int(arm)))
            s = run.summary
            arms[arm].append({"prefix_hit_rate": s.prefix_hit_rate, "completed": s.completed,
                              "errors": s.errors, "req_per_s": s.request_throughput})  # fmt: skip
            print(f"{arm} frontend(s): {arms[arm][-1]}")
    rates = {arm: [r["prefix_hit_rate"] or 0.0 for r in runs] for arm, runs in arms.items()}
    mean = {arm: round(sum(v) / len(v), 4) for arm, v in rates.items()}
    result = {
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "deployment": f"1 worker process x {WORKERS} mocker instances ({' '.join(WORKER_ARGS)}, "
        "block 16), kv mode",
        "workload": WORKLOAD,
        "rounds": args.rounds,
        "runs": arms,
        "mean_prefix_hit_rate": mean,
        "difference_points": round(100 * (mean["1"] - mean[str(args.frontends)]), 2),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["mean_prefix_hit_rate"]), "difference", result["difference_points"])


if __name__ == "__main__":
    main()
