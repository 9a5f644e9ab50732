"""Two commits of dynamoctl side by side in one run: what a change to the hot path costs.

    python benchmarks/commit_compare.py BASE HEAD [--concurrency 1,8,32,128] [--seconds 4]
        [--workload short|multiturn]
        [--rounds 3] [--out benchmarks/results/commit_compare.json]

Each commit is checked out into a git worktree of its own in a temporary directory and runs
from there (``PYTHONPATH``): the same deployment and load as benchmarks/dynamo_compare.py
(one frontend with KV routing and 4 mocker workers at speedup 1000 in a network namespace,
closed-loop clients of streamed 16-token completions inside it), imported from there. The
commits alternate for ``--rounds`` rounds, the first commit going first in even rounds and
second in odd ones, so drift on the machine hits both; with ``--together`` both run at
the same time instead (each level starting at the same moment), which on a shared,
loaded machine is what keeps the ratio steady (both see the same load). Reported per
concurrency: req/s, TTFT and end-to-end p50/p99, and the frontend's CPU per request and
per streamed token (psutil of the frontend process). Needs root (``ip netns``); run it under
``flock /tmp/dynamoctl-cluster.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from dynamo_compare import REPO, WORKLOADS, dynamo_commands, dynamoctl_commands, serve_and_load

T = TypeVar("T")


def checkout(commit: str, into: Path) -> tuple[str, Path]:
    """A detached worktree of ``commit`` under ``into``: (full hash, its path)."""
    full = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    path = into / full[:12]
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), full],
        capture_output=True, check=True,
    )  # fmt: skip
    return full, path


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that makes ``python -m dynamoctl`` run ``tree``'s code, checked.
    ``PYTHONSAFEPATH``: without it ``-m`` and ``-c`` put the current directory first on
    ``sys.path``, and run from the repository's root both commits would run the working
    tree's code (as this script did until the eleventh session: docs/benchmarks.md)."""
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "import dynamoctl; print(dynamoctl.__file__)"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not Path(probe).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"dynamoctl imports from {probe}, not from {tree}")
    return env


@contextlib.contextmanager
def worktrees(*commits: str, prefix: str = "commit-cmp-") -> Iterator[dict[str, Path]]:
    """Each commit in a detached git worktree of its own, removed on the way out."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        trees: dict[str, Path] = {}
        try:
            for commit in commits:
                full, trees[commit] = checkout(commit, Path(tmp))
                print(f"{commit} = {full}", flush=True)
            yield trees
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )  # fmt: skip


def alternating(
    base: str, head: str, repeat: int, run: Callable[[Path], T], prefix: str
) -> dict[str, list[T]]:
    """``run`` on each commit's tree ``repeat`` times, the commits alternating (the base
    first in even runs), so that drift on the machine hits both."""
    runs: dict[str, list[T]] = {base: [], head: []}
    with worktrees(base, head, prefix=prefix) as trees:
        for i in range(repeat):
            for name in (base, head) if i % 2 == 0 else (head, base):
                runs[name].append(run(trees[name]))
                print(f"run {i} {name:10s} {runs[name][-1]}", flush=True)
    return runs


DYNAMO = "dynamo-1.6.1"
"""The name Dynamo's rows go under beside dynamoctl commits."""


def commands_for(tmp: str, tree: Path | None, venv: Path) -> tuple[list[list[str]], dict[str, str]]:
    """dynamo_compare.py's deployment: dynamoctl from ``tree``, or Dynamo from ``venv``
    when ``tree`` is None."""
    if tree is None:
        return dynamo_commands(tmp, venv)
    commands, env = dynamoctl_commands(tmp)
    return commands, {**env, **tree_env(tree)}


def alternating_systems(
    commits: list[str],
    with_dynamo: bool,
    rounds: int,
    run: Callable[[Path | None], dict[str, float]],
    prefix: str,
) -> dict[str, list[dict[str, float]]]:
    """``run`` on each commit's tree and, with ``with_dynamo``, on Dynamo (tree None), for
    ``rounds`` rounds in an order reversed every other round, so that drift on the
    machine hits every system; the rows by system."""
    runs: dict[str, list[dict[str, float]]] = {}
    with worktrees(*commits, prefix=prefix) as trees:
        systems: list[tuple[str, Path | None]] = [(c, trees[c]) for c in commits]
        if with_dynamo:
            systems.append((DYNAMO, None))
        for round_ in range(rounds):
            for name, tree in systems if round_ % 2 == 0 else systems[::-1]:
                row = run(tree)
                runs.setdefault(name, []).append(row)
                print(f"round {round_} {name:<14} {json.dumps(row)}", flush=True)
    return runs


def medians(runs: dict[str, list[dict[str, float]]], digits: int) -> dict[str, dict[str, float]]:
    """Each system's median of rounds, field by field (printed too)."""
    out = {
        name: {k: round(statistics.median(r[k] for r in rows), digits) for k in rows[0]}
        for name, rows in runs.items()
    }
    for name, row in out.items():
        print(f"median {name:<14} {json.dumps(row)}")
    return out


def measure(
    label: str,
    tree: Path,
    levels: list[int],
    seconds: float,
    workload: str,
    barrier: threading.Barrier | None = None,
) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        commands, extra = dynamoctl_commands(tmp)
        extra = {**extra, **tree_env(tree)}
        name = f"commit-cmp{label}-{os.getpid()}"
        load_args = ["--workload", workload]
        return serve_and_load(name, commands, extra, levels, seconds, tmp, load_args, barrier)


def run_round(
    order: list[str],
    trees: dict[str, Path],
    levels: list[int],
    seconds: float,
    together: bool,
    workload: str,
) -> dict[str, list[dict[str, float]]]:
    """One round: each commit's deployment under the load, one after the other, or both at
    once (``together``: each level starts at the same moment for both)."""
    if not together:
        return {
            c: measure(str(i), trees[c], levels, seconds, workload) for i, c in enumerate(order)
        }
    barrier = threading.Barrier(len(order))
    with ThreadPoolExecutor(len(order)) as pool:
        futures = {
            c: pool.submit(measure, str(i), trees[c], levels, seconds, workload, barrier)
            for i, c in enumerate(order)
        }
        return {c: f.result() for c, f in futures.items()}


def best_of(rounds: list[list[dict[str, float]]], level: int) -> dict[str, float]:
    return max((r[level] for r in rounds), key=lambda row: row["req_per_s"])


def summary(
    results: dict[str, list[list[dict[str, float]]]], base: str, head: str, levels: list[int]
) -> list[dict[str, Any]]:
    """Per level: head's best round over base's best round (req/s, p99, CPU per request),
    and the median over rounds of each round's ratio (with ``--together`` both arms of a
    round ran at the same moment: that median is the steadiest figure)."""
    out = []
    for i, level in enumerate(levels):
        b, h = best_of(results[base], i), best_of(results[head], i)
        pairs = list(zip(results[base], results[head], strict=True))
        out.append({
            "median_round_req_per_s_ratio": round(statistics.median(
                rh[i]["req_per_s"] / max(rb[i]["req_per_s"], 1e-9) for rb, rh in pairs), 3),
            "median_round_cpu_per_req_ratio": round(statistics.median(
                rh[i]["frontend_cpu_ms_per_req"] / max(rb[i]["frontend_cpu_ms_per_req"], 1e-9)
                for rb, rh in pairs), 3),
            "median_round_main_thread_cpu_per_req_ratio": round(statistics.median(
                rh[i]["frontend_main_thread_cpu_ms_per_req"]
                / max(rb[i]["frontend_main_thread_cpu_ms_per_req"], 1e-9)
                for rb, rh in pairs), 3),
            "median_round_threads_cpu_per_req_ms": {
                c: round(statistics.median(
                    r[i]["frontend_cpu_ms_per_req"] - r[i]["frontend_main_thread_cpu_ms_per_req"]
                    for r in results[c]), 3)
                for c in (base, head)},
            # The workers share the machine: their CPU per request moves req/s too.
            "median_round_workers_cpu_per_req_ratio": round(statistics.median(
                rh[i]["workers_cpu_ms_per_req"] / max(rb[i]["workers_cpu_ms_per_req"], 1e-9)
                for rb, rh in pairs), 3),
            "concurrency": level,
            "base_req_per_s": b["req_per_s"], "head_req_per_s": h["req_per_s"],
            "req_per_s_ratio": round(h["req_per_s"] / max(b["req_per_s"], 1e-9), 3),
            "e2e_p99_ratio": round(h["e2e_p99_ms"] / max(b["e2e_p99_ms"], 1e-9), 3),
            "base_cpu_ms_per_req": b["frontend_cpu_ms_per_req"],
            "head_cpu_ms_per_req": h["frontend_cpu_ms_per_req"],
            "cpu_per_req_ratio": round(
                h["frontend_cpu_ms_per_req"] / max(b["frontend_cpu_ms_per_req"], 1e-9), 3),
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the commit before (e.g. d23328b)")
    parser.add_argument("head", help="the commit after (e.g. main)")
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--together",
        action="store_true",
        help="run both commits at the same time, each level starting together, so that "
        "both see the same machine load: on a shared machine the ratio is what is steady",
    )
    parser.add_argument("--out", default="benchmarks/results/commit_compare.json")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    load_before = os.getloadavg()
    results: dict[str, list[list[dict[str, float]]]] = {args.base: [], args.head: []}
    with worktrees(args.base, args.head) as trees:
        for round_ in range(args.rounds):
            order = [args.base, args.head] if round_ % 2 == 0 else [args.head, args.base]
            measured = run_round(order, trees, levels, args.seconds, args.together, args.workload)
            for commit in order:
                results[commit].append(measured[commit])
                for row in measured[commit]:
                    print(
                        f"round {round_} {commit:<10} c={row['concurrency']:<4} "
                        f"{row['req_per_s']:>7} req/s  TTFT p50/p99 {row['ttft_p50_ms']}/"
                        f"{row['ttft_p99_ms']} ms  e2e p50/p99 {row['e2e_p50_ms']}/"
                        f"{row['e2e_p99_ms']} ms  frontend "
                        f"{row['frontend_cpu_ms_per_req']} ms/req (main thread "
                        f"{row['frontend_main_thread_cpu_ms_per_req']})  workers "
                        f"{row['workers_cpu_ms_per_req']} ms/req  errors {row['errors']}",
                        flush=True,
                    )
    ratios = summary(results, args.base, args.head, levels)
    for row in ratios:
        print(
            f"c={row['concurrency']:<4} {args.head}/{args.base}: req/s x{row['req_per_s_ratio']}"
            f"  e2e p99 x{row['e2e_p99_ratio']}  CPU/req x{row['cpu_per_req_ratio']}  "
            f"(medians of rounds: req/s x{row['median_round_req_per_s_ratio']}, CPU/req "
            f"x{row['median_round_cpu_per_req_ratio']}, main thread's "
            f"x{row['median_round_main_thread_cpu_per_req_ratio']}, other threads' ms/req "
            f"{row['median_round_threads_cpu_per_req_ms']}, workers' CPU/req "
            f"x{row['median_round_workers_cpu_per_req_ratio']})"
        )
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "workload": WORKLOADS[args.workload],
        "base": args.base, "head": args.head, "seconds": args.seconds,
        "together": args.together,
        "rounds": results,
        "head_over_base": ratios,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
