"""The frontend's garbage-collection pauses under load, at two or more commits side by side.

    python benchmarks/gc_pauses.py 13b38ca HEAD [--concurrency 32] [--seconds 6] [--rounds 3]

A full collection (generation 2) stops the frontend's event loop while it walks every
object the collector tracks; each request in flight waits. This serves each commit as
benchmarks/dynamo_compare.py does (4 mocker workers at speedup 1000, KV routing, in a
network namespace of its own), runs its short-stream load at ``--concurrency``, and
records every collection the frontend makes meanwhile through ``gc.callbacks``, installed
by a ``sitecustomize`` module this script writes into a temporary folder put first on
the frontend's ``PYTHONPATH`` (the code measured is the commit's own). Per commit and
round: the load's req/s and end-to-end p99, and per generation the collections, their
longest pause and their total time. The commits alternate for ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from commit_compare import tree_env, worktrees
from dynamo_compare import dynamoctl_commands, load_level, serving
from machine import machine

PROBE = """
import gc, json, os, sys, threading, time
if any(a == "frontend" for a in sys.argv):
    _begun = [0.0]
    _pauses = []  # (generation, wall time at the end, seconds)

    def _on_collection(phase, info):
        if phase == "start":
            _begun[0] = time.perf_counter()
        else:
            _pauses.append((info["generation"], time.time(), time.perf_counter() - _begun[0]))

    def _dump():
        out = os.path.join(os.environ["GC_PAUSES_DIR"], f"{os.getpid()}.json")
        while True:
            time.sleep(0.5)
            with open(out + ".new", "w") as f:
                json.dump(list(_pauses), f)
            os.replace(out + ".new", out)

    gc.callbacks.append(_on_collection)
    threading.Thread(target=_dump, daemon=True).start()
"""


def pauses_between(path: Path, begun: float, ended: float) -> dict[str, float]:
    """Per generation: collections, longest and total pause (ms) within the load."""
    time.sleep(1.0)  # the probe writes every 0.5 s
    rows = [p for p in json.loads(path.read_text()) if begun <= p[1] <= ended]
    out: dict[str, float] = {}
    for gen in (0, 1, 2):
        ms = [p[2] * 1e3 for p in rows if p[0] == gen]
        out[f"gen{gen}_collections"] = len(ms)
        out[f"gen{gen}_max_ms"] = round(max(ms, default=0.0), 2)
        out[f"gen{gen}_total_ms"] = round(sum(ms), 1)
    return out


def measure(tree: Path, level: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        commands, env = dynamoctl_commands(tmp)
        env = {**env, **tree_env(tree), "GC_PAUSES_DIR": tmp}
        env["PYTHONPATH"] = f"{probe}:{env['PYTHONPATH']}"
        with serving(f"gc-pauses-{os.getpid()}", commands, env, tmp) as (prefix, fe, workers):
            load_level(prefix, fe, workers, 8, 3.0, None, None)  # warm-up
            begun = time.time()
            row = load_level(prefix, fe, workers, level, seconds, None, None)
            row.update(pauses_between(Path(tmp) / f"{fe.pid}.json", begun, time.time()))
            return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commits", nargs="+", help="dynamoctl commits (e.g. 13b38ca HEAD)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "gc_pauses.json"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {}
    with worktrees(*args.commits, prefix="gc-pauses-") as trees:
        for round_ in range(args.rounds):
            order = args.commits if round_ % 2 == 0 else list(reversed(args.commits))
            for commit in order:
                row = measure(trees[commit], args.concurrency, args.seconds)
                runs.setdefault(commit, []).append(row)
                print(f"round {round_} {commit:<10} {json.dumps(row)}", flush=True)
    keys = ("req_per_s", "e2e_p99_ms", "gen2_collections", "gen2_max_ms", "gen0_total_ms",
            "gen1_total_ms", "gen2_total_ms")  # fmt: skip
    medians = {
        c: {k: statistics.median(r[k] for r in rows) for k in keys} for c, rows in runs.items()
    }
    for commit, row in medians.items():
        print(f"median {commit:<10} {json.dumps(row)}")
    report = {
        "machine": machine(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "workload": f"short streams (16 tokens) at concurrency {args.concurrency}, "
        f"{args.seconds} s a round, 4 mocker workers at speedup 1000, kv router",
        "rounds": runs,
        "medians": medians,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
