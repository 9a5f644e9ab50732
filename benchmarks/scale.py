"""128 simulated workers behind one frontend: start-up, routing and streaming at that scale.

    python benchmarks/scale.py [--deployments 4x32,1x8] [--concurrency 32,128]
                               [--requests 1000] [--out FILE]

For each of ``--deployments`` (PROCESSESxPER_PROCESS, one after the other in one run, so
the 8-worker baseline is measured beside the 128 workers on the same machine state):
starts that many worker processes of that many mocker instances each (``dynamoctl worker
--num-workers``; speedup 100, 2048 blocks of 16 tokens each) and one frontend with the
``kv`` router, which subscribes to the KV events and load of every instance. The load is
``dynamoctl bench``'s closed loop: 2-turn conversations (256 new tokens a turn, 32 output
tokens) after one of 64 shared 512-token system prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import psutil
from cluster import MODEL, cluster, cpu_seconds
from machine import machine

from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.report import summary_table
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, Summary, summarize
from dynamoctl.bench.workload import LengthDist, synthetic_sessions

WORKER_ARGS = ["--num-gpu-blocks", "2048", "--speedup-ratio", "100"]


async def run(processes: int, per: int, levels: list[int], requests: int) -> dict[str, Any]:
    began = time.perf_counter()
    async with cluster(processes=processes, per_process=per, worker_args=WORKER_ARGS) as dep:
        ready_s = time.perf_counter() - began
        print(f"{processes * per} workers served after {ready_s:.1f} s")
        clock = LoopClock()
        sender = Sender(Endpoint(dep.url), MODEL, clock, timeout=60)
        rows: list[dict[str, Any]] = []
        summaries: list[Summary] = []
        for level in levels:
            sessions = synthetic_sessions(LengthDist.parse("256"), LengthDist.parse("32"),
                                          turns=2, shared_prefix=512, prefix_groups=64,
                                          seed=level)  # fmt: skip
            front0 = cpu_seconds(dep.frontend)
            workers0 = sum(cpu_seconds(w) for w in dep.workers)
            client0 = cpu_seconds(psutil.Process())
            outcome = await drive(sessions, sender.send, clock=clock,
                                  limits=Limits(requests, 60, 30), concurrency=level)  # fmt: skip
            s = summarize(outcome, Slo(), label=f"c={level}", concurrency=level)
            summaries.append(s)
            front = (cpu_seconds(dep.frontend) - front0) / s.duration_s
            workers = (sum(cpu_seconds(w) for w in dep.workers) - workers0) / s.duration_s
            client = (cpu_seconds(psutil.Process()) - client0) / s.duration_s
            rows.append({"concurrency": level, "summary": json.loads(_json(s)),
                         "frontend_cpu_cores": round(front, 2),
                         "worker_processes_cpu_cores": round(workers, 2),
                         "load_generator_cpu_cores": round(client, 2)})  # fmt: skip
            print(
                f"c={level}: frontend {front:.2f} cores, workers {workers:.2f} cores, "
                f"load generator {client:.2f} cores"
            )
        print(summary_table(summaries))
        return {"processes": processes, "per_process": per, "workers": processes * per,
                "ready_after_s": round(ready_s, 1), "rows": rows}  # fmt: skip


def _json(obj: Any) -> str:
    import msgspec

    return msgspec.json.encode(obj).decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deployments", default="4x32,1x8", help="PROCESSESxPER_PROCESS,...")
    parser.add_argument("--concurrency", default="32,128")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--out", default="benchmarks/results/scale.json")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    shapes = [tuple(int(n) for n in d.split("x")) for d in args.deployments.split(",")]
    runs = [asyncio.run(run(procs, per, levels, args.requests)) for procs, per in shapes]
    result = {
        "machine": machine(),
        "deployment": "PROCESSES worker processes x PER_PROCESS mocker instances "
        f"({' '.join(WORKER_ARGS)}, block 16), 1 frontend (kv router)",
        "workload": "closed loop; 2 turns of 256 new tokens + 32 output tokens after one of 64 "
        "shared 512-token prefixes",
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
