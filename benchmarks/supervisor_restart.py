"""Supervisor restart probe: what streaming clients notice when the supervisor is SIGKILLed
and a new ``dynamoctl up`` adopts the running instances (docs/operations.md, "Restarting
the supervisor").

    python benchmarks/supervisor_restart.py [--seconds 30] [--kill-at 5] [--up-at 10]
        [--concurrency 16] [--out benchmarks/results/supervisor_restart.json]

``dynamoctl up --detach`` of a local recipe (3 mocker workers, ``orphan_grace: 60``) in a
private ``DYNAMOCTL_HOME``; a closed loop of ``--concurrency`` streaming requests for
``--seconds``; the supervisor SIGKILLed at ``--kill-at`` and ``up`` run again at
``--up-at``. Reports failed requests, TTFT and the longest in-stream gap (p50/p99/max),
how long the second ``up`` took until serving, and whether every instance kept its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos import dynamoctl as run_dynamoctl
from chaos import free_port
from probes import MODEL, mocker_recipe, stream_summary

from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.workload import LengthDist, synthetic_sessions

NAME = "restartprobe"
SUPERVISION = "supervision: {orphan_grace: 60, probe_interval: 0.5}\n"


def pids(home: Path) -> dict[str, int]:
    result = run_dynamoctl(home, "status", "--json", NAME)
    return {row["name"]: row["pid"] for row in json.loads(result.stdout)["instances"]}


async def restart(args: argparse.Namespace, home: Path, recipe: Path) -> dict[str, Any]:
    """SIGKILL the supervisor at ``kill_at``, ``up`` again at ``up_at``: what it took."""
    await asyncio.sleep(args.kill_at)
    state = json.loads((home / "runs" / NAME / "state.json").read_text())
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    await asyncio.sleep(args.up_at - args.kill_at)
    started = time.monotonic()
    up = await asyncio.to_thread(run_dynamoctl, home, "up", str(recipe), "--detach")
    took = time.monotonic() - started
    if up.returncode != 0:
        raise SystemExit(f"second up failed: {up.stderr}")
    return {"second_up_s": round(took, 2)}


async def probe(args: argparse.Namespace, url: str, home: Path, recipe: Path) -> dict[str, Any]:
    clock = LoopClock()
    endpoint = Endpoint(url)
    sender = Sender(endpoint, MODEL, clock, timeout=60)
    sessions = synthetic_sessions(LengthDist.parse("256"), LengthDist.parse("128"), seed=0)
    restarting = asyncio.create_task(restart(args, home, recipe))
    outcome = await drive(
        sessions, sender.send, clock=clock, concurrency=args.concurrency,
        limits=Limits(10**9, args.seconds, 30),
    )  # fmt: skip
    found = await restarting
    await endpoint.close()
    return stream_summary(outcome.records, outcome.unfinished) | found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--kill-at", type=float, default=5.0)
    parser.add_argument("--up-at", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/supervisor_restart.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="restartprobe-") as tmp:
        home, port = Path(tmp) / "home", free_port()
        recipe = Path(tmp) / "recipe.yaml"
        recipe.write_text(mocker_recipe(NAME, port, 3, 2, SUPERVISION))
        up = run_dynamoctl(home, "up", str(recipe), "--detach")
        if up.returncode != 0:
            raise SystemExit(up.stderr)
        try:
            before = pids(home)
            found = asyncio.run(probe(args, f"http://127.0.0.1:{port}", home, recipe))
            found["same_pids"] = pids(home) == before
        finally:
            run_dynamoctl(home, "down", NAME, "--now")
    result = {
        "probe": "supervisor_restart",
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
        | {"platform": platform.platform()},
        "result": found,
    }
    print(json.dumps(result["result"]))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
