"""Warm spares against cold starts, side by side in one run (docs/operations.md, "Warm
spares"): how long ``scale`` up takes until the new replica is READY, and how long a
replica killed with -9 takes until the pool has its READY count back, with a spare on
standby and without one.

    python benchmarks/spares.py [--rounds 3] [--weights-gb 16] [--init-s 30]
        [--out benchmarks/results/fast_start_spares.json]

``dynamoctl up --detach`` of a local recipe in a private ``DYNAMOCTL_HOME``: one agg
replica and ``spares: 1`` of a mocker that starts like an 8B model on one GPU (16 GB of
weights read from a shared filesystem at 1 GB/s, then 30 s of engine initialisation: 46 s,
``speedup-ratio: 1``), the supervision settings left at their defaults. Each round, on the
supervisor's control endpoint (status polled every 50 ms):

1. ``scale agg=2`` with the spare on standby: promotion (``spare_promotion_s``);
2. at once ``scale agg=3``, the next spare still starting: a cold start (``cold_scale_s``);
3. once a spare is on standby again and nothing is starting, SIGKILL a READY replica's
   worker: the spare takes its place (``spare_replacement_s``: kill to the READY count
   back);
4. at once SIGKILL another, no spare on standby: its restart (``cold_replacement_s``);
5. ``scale agg=1`` and wait for a spare on standby: the next round's start.

The order is fixed (a cold arm is the one where the spare was just used), so the arms are
not alternated; their difference is the start-up itself, tens of seconds against one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from chaos import dynamoctl, free_port
from machine import machine

from dynamoctl.control.client import ControlClient
from dynamoctl.wire.control import InstanceStatus, StatusReport
from dynamoctl.wire.states import State

NAME = "sparebench"
POLL_S = 0.05


def recipe(port: int, weights_gb: float, init_s: float) -> str:
    return f"""\
schema: 1
name: {NAME}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: mocker
    replicas: 1
    spares: 1
    gpus_per_replica: 0
    engine_args:
      num-gpu-blocks: 1024
      speedup-ratio: 1
      weights-bytes: {int(weights_gb * 1e9)}
      weights-source: shared-fs
      engine-init-s: {init_s}
"""


def workers(report: StatusReport) -> list[InstanceStatus]:
    return [r for r in report.instances if r.component == "worker"]


def wait(
    client: ControlClient, until: Callable[[StatusReport], bool], what: str, limit: float = 300
) -> float:
    """Seconds until ``until(status)``; SystemExit past ``limit``."""
    began = time.monotonic()
    while True:
        report = client.status()
        if until(report):
            return time.monotonic() - began
        if time.monotonic() - began > limit:
            raise SystemExit(f"timed out waiting for {what}: {report}")
        time.sleep(POLL_S)


def ready(report: StatusReport, besides: int | None = None) -> int:
    """READY replicas, not counting the process group ``besides`` (one just killed)."""
    return sum(1 for r in workers(report) if r.state is State.READY and r.pid != besides)


def on_standby(report: StatusReport) -> int:
    return sum(1 for r in workers(report) if r.state is State.STANDBY)


def settled(report: StatusReport) -> bool:
    """No worker on its way anywhere: every one READY or STANDBY (or STOPPED)."""
    steady = (State.READY, State.STANDBY, State.STOPPED)
    return all(w.state in steady for w in workers(report))


def scale_to(client: ControlClient, replicas: int) -> float:
    """``scale agg=replicas`` until that many are READY: seconds."""
    began = time.monotonic()
    client.scale("agg", replicas)
    wait(client, lambda r: ready(r) >= replicas, f"{replicas} READY")
    return time.monotonic() - began


def kill_one(client: ControlClient) -> float:
    """SIGKILL one READY replica's worker: seconds until the READY count is back."""
    report = client.status()
    count = ready(report)
    victim = next(r for r in workers(report) if r.state is State.READY)
    assert victim.pid is not None
    worker = psutil.Process(victim.pid).children()[0]  # the keeper's child
    began = time.monotonic()
    os.kill(worker.pid, signal.SIGKILL)
    wait(client, lambda r: ready(r, besides=victim.pid) >= count, "the READY count back")
    return time.monotonic() - began


def one_round(client: ControlClient) -> dict[str, float]:
    out = {"spare_promotion_s": scale_to(client, 2), "cold_scale_s": scale_to(client, 3)}
    # Nothing still starting: a cold start ending during a kill's arm would count as it.
    wait(client, lambda r: on_standby(r) >= 1 and settled(r), "a spare on standby")
    out["spare_replacement_s"] = kill_one(client)
    out["cold_replacement_s"] = kill_one(client)
    client.scale("agg", 1)
    wait(client, lambda r: ready(r) == 1 and on_standby(r) == 1 and settled(r), "1 + 1 spare")
    print({k: round(v, 3) for k, v in out.items()}, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--weights-gb", type=float, default=16.0)
    parser.add_argument("--init-s", type=float, default=30.0)
    default = Path(__file__).resolve().parent / "results" / "fast_start_spares.json"
    parser.add_argument("--out", default=str(default))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spares-") as tmp:
        home = Path(tmp)
        path = home / "recipe.yaml"
        path.write_text(recipe(free_port(), args.weights_gb, args.init_s))
        up = dynamoctl(home, "up", str(path), "--detach", timeout=600)
        if up.returncode != 0:
            raise SystemExit(f"up failed: {up.stderr}")
        state = json.loads((home / "runs" / NAME / "state.json").read_text())
        client = ControlClient(state["control"], state["token"], timeout=30)
        try:
            wait(client, lambda r: on_standby(r) >= 1, "the first spare")
            first = client.status()
            runs = [one_round(client) for _ in range(args.rounds)]
            measured = client.status().measured_start_s
        finally:
            client.close()
            dynamoctl(home, "down", NAME, timeout=300)
    keys = ("spare_promotion_s", "cold_scale_s", "spare_replacement_s", "cold_replacement_s")
    medians = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    result = {
        **medians,
        "promotion_vs_cold_start": round(medians["cold_scale_s"] / medians["spare_promotion_s"], 1),
        "replacement_vs_cold_restart": round(
            medians["cold_replacement_s"] / medians["spare_replacement_s"], 1
        ),
        "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "engine_start_s": args.weights_gb + args.init_s,
        "first_start_phases": [
            {"instance": r.name, **json.loads(json.dumps(r.start, default=_plain))}
            for r in workers(first)
            if r.start is not None
        ],
        "measured_start_s": measured,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


def _plain(obj: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(obj)


if __name__ == "__main__":
    main()
