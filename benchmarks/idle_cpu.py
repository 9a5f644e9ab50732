"""What a deployment at rest costs: each process's CPU while no request comes, for
dynamoctl at one or more commits and NVIDIA Dynamo 1.6.1, side by side in one run.

    python benchmarks/idle_cpu.py [--commits 45e1744,HEAD] [--seconds 10] [--rounds 3]
                                  [--no-dynamo]

The deployment is dynamo_compare.py's (4 mocker workers at speedup 1000 in one process,
KV routing, embedded or file discovery), in a network namespace of its own. Once it
serves, it is left alone for ``--settle`` seconds, then each process's CPU (its
children's included) is read around ``--seconds`` of quiet: milliseconds of CPU per
second, i.e. thousandths of a core. At rest a process still polls discovery, pings its
peers and wakes its timers; a frontend's share of that is also spent between the requests
of a lightly loaded deployment. The systems alternate for ``--rounds`` rounds; per system
the median of rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from commit_compare import alternating_systems, commands_for, medians
from dynamo_compare import REPO, cpu_seconds, serving
from machine import machine


def measure(tree: Path | None, venv: Path, settle: float, seconds: float) -> dict[str, float]:
    """One deployment (dynamoctl from ``tree``, or Dynamo): CPU per second at rest."""
    with tempfile.TemporaryDirectory() as tmp:
        commands, env = commands_for(tmp, tree, venv)
        with serving(f"idle-cpu-{os.getpid()}", commands, env, tmp) as (_, frontend, workers):
            time.sleep(settle)
            before = [cpu_seconds(p) for p in (frontend, *workers)]
            time.sleep(seconds)
            after = [cpu_seconds(p) for p in (frontend, *workers)]
    rates = [round((a - b) * 1e3 / seconds, 2) for a, b in zip(after, before, strict=True)]
    frontend_ms, *worker_ms = rates
    return {"frontend_cpu_ms_per_s": frontend_ms, "workers_cpu_ms_per_s": sum(worker_ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", default="HEAD", help="dynamoctl commits, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-dynamo", action="store_true")
    parser.add_argument("--dynamo-venv", type=Path, default=REPO / "benchmarks" / ".dynamo-venv")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "idle_cpu.json"
    )
    args = parser.parse_args()
    commits = args.commits.split(",")
    runs = alternating_systems(
        commits,
        not args.no_dynamo,
        args.rounds,
        lambda tree: measure(tree, args.dynamo_venv, args.settle, args.seconds),
        "idle-cpu-",
    )
    by_system = medians(runs, 2)
    report = {
        "machine": machine(),
        "seconds": args.seconds,
        "settle_seconds": args.settle,
        "rounds": runs,
        "medians": by_system,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
