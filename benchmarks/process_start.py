"""What each kind of dynamoctl process costs before it does anything: the CPU time of
importing the modules it runs (a frontend, a mocker worker, a supervisor, a router, the
`status` command), for two commits side by side in one run.

    python benchmarks/process_start.py f8ed247 main [--repeat 7] [--out FILE]

Each commit is checked out into a git worktree of its own (benchmarks/commit_compare.py's
``checkout``); each measurement is a fresh interpreter importing the process's modules from
that tree with bytecode already written (a first run per tree writes it), and reports the
CPU seconds the import took (``time.process_time``: less sensitive to a shared machine than
wall time). The median of ``--repeat`` runs is kept. Every process the supervisor starts
pays this, and the test suite starts thousands.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from commit_compare import worktrees
from dynamo_compare import REPO
from machine import machine

PROCESSES = {
    "frontend": ["dynamoctl.frontend.main"],
    "mocker_worker": ["dynamoctl.worker.main", "dynamoctl.engines.mocker.engine"],
    "supervisor": ["dynamoctl.supervisor.supervisor", "dynamoctl.cli.deploy"],
    "router": ["dynamoctl.router.service"],
    "status": ["dynamoctl.cli.operate"],
}
"""Each process kind and the modules it imports to run."""

_PROBE = """
import importlib, sys, time
started = time.process_time()
for name in sys.argv[1:]:
    importlib.import_module(name)
print(time.process_time() - started)
"""


def import_seconds(tree: Path, modules: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a deployment's processes write them too
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(out.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/process_start.json")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with worktrees(args.base, args.head, prefix="process-start-") as trees:
        for kind, modules in PROCESSES.items():
            for tree in trees.values():
                import_seconds(tree, modules)  # writes this tree's bytecode
            runs: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.repeat):  # alternate the commits: same machine state
                for name, tree in trees.items():
                    runs[name].append(import_seconds(tree, modules))
            results[kind] = {n: round(statistics.median(r) * 1000, 1) for n, r in runs.items()}
            base, head = results[kind][args.base], results[kind][args.head]
            print(f"{kind:14s} {args.base} {base:7.1f} ms  {args.head} {head:7.1f} ms  "
                  f"x{head / base:.2f}")  # fmt: skip
    report = {
        "machine": machine(),
        "base": args.base,
        "head": args.head,
        "repeat": args.repeat,
        "import_cpu_ms_median": results,
        "head_over_base": {k: round(v[args.head] / v[args.base], 2) for k, v in results.items()},
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
