"""The planner in a running deployment (``dynamoctl up``, local target, mocker workers on
the real clock): a load step makes it add replicas within a few load intervals, up to the
GPU budget, where it says it is budget-bound rather than passing it; a load drop makes it
take them away by draining, with no client request failing; the budget holds in every
status seen along the way; and the supervisor restarts a killed planner."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
import pytest

from tests.planner.load import StepLoad
from tests.supervisor.conftest import Cli, free_port

pytestmark = pytest.mark.planner

BUDGET = 2
GONE = ("STOPPED", "FAILED")


def recipe(port: int) -> str:
    # 1000-word prompts (no shared prefix) cost ~30 ms of simulated prefill each alone; 12
    # clients keep the TTFT of one or two replicas above 150 ms (three would be needed, one
    # more than the budget), one client far below 80% of it. The
    # router never refuses (busy_kv_usage null) and the frontend queues long, so that a
    # failed request can only come from a scale-down.
    return f"""\
schema: 1
name: planned
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}, queue_timeout: 60.0, router: {{busy_kv_usage: null}}}}
workers:
  agg:
    engine: mocker
    replicas: 1
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 8192, speedup-ratio: 1}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, hang_timeout: 20, drain_timeout: 30}}
planner:
  mode: load
  ttft_target_ms: 150.0
  itl_target_ms: 1000.0
  agg_max_replicas: {BUDGET + 1}
  gpu_budget: {BUDGET}
  load_interval: 0.5
  cooldown: 1.5
  stable_intervals: 2
"""


def agg_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in report["instances"] if row["pool"] == "agg"]


class Watch:
    """Every status seen; each is checked against the budget as it comes."""

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.seen: list[dict[str, Any]] = []

    def until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            report = self.cli.status()
            self.seen.append(report)
            holding = [row for row in agg_rows(report) if row["state"] not in GONE]
            assert len(holding) <= BUDGET, f"over the GPU budget: {holding}"
            planner = report.get("planner")
            if planner is not None:
                assert planner["gpus"] <= planner["budget"] == BUDGET, planner
            if predicate(report):
                return report
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {report}"
            time.sleep(0.25)


def desired(report: dict[str, Any]) -> int:
    planner = report.get("planner") or {"pools": []}
    return next((pool["desired"] for pool in planner["pools"] if pool["role"] == "agg"), 0)


def test_load_step_scales_up_and_load_drop_drains_back(cli: Cli) -> None:
    port = free_port()
    up = cli("up", str(cli.recipe(recipe(port))), "--detach", timeout=120)
    assert up.returncode == 0, up.stderr
    watch = Watch(cli)
    watch.until(lambda r: (r.get("planner") or {}).get("phase") == "planning", 30, "planning")

    with StepLoad(f"http://127.0.0.1:{port}/v1") as load:
        stepped = time.monotonic()
        report = watch.until(lambda r: desired(r) >= 2, 30, "a scale-up")
        reacted = time.monotonic() - stepped
        # The step holds: the planner wants a third replica, the budget says no, and the
        # status says so (the watch checks every status against the budget).
        bound = watch.until(
            lambda r: (r.get("planner") or {}).get("budget_bound", False), 30, "budget-bound"
        )
        load.drop()
        # The one client left keeps requests flowing while the planner drains.
        report = watch.until(
            lambda r: (
                desired(r) == 1
                and [row["name"] for row in agg_rows(r) if row["state"] not in GONE] == ["agg-0"]
            ),
            60,
            "the drain back to one replica",
        )

    assert load.errors == [], load.errors[:3]
    pool = bound["planner"]["pools"][0]
    assert pool["budget_bound"] and pool["desired"] == BUDGET, bound["planner"]
    assert "budget-bound: gpu_budget 2 is spent" in pool["reason"]
    assert len(load.done) > 20
    assert reacted < 15.0, f"took {reacted:.1f} s to add a replica"
    stopped = [row for row in agg_rows(report) if row["name"] != "agg-0"]
    assert stopped and all(row["state"] == "STOPPED" and row["restarts"] == 0 for row in stopped)
    assert report["planner"]["last_change"].endswith("-> 1"), report["planner"]
    log = (cli.home / "runs" / "planned" / "logs" / "planner-0.log").read_text()
    print(log)  # the decisions and their inputs, shown when the test fails
    assert "load loop: agg 1 -> 2" in log and "TTFT" in log  # decisions logged with inputs
    assert "draining agg-1" in log  # scale-down went through the supervisor's drain

    # A killed planner is restarted by the supervisor and plans again from the counts.
    row = next(r for r in report["instances"] if r["name"] == "planner-0")
    os.kill(psutil.Process(row["pid"]).children()[0].pid, signal.SIGKILL)  # the keeper's child
    watch.until(
        lambda r: (
            any(x["name"] == "planner-0" and x["restarts"] == 1 for x in r["instances"])
            and (r.get("planner") or {}).get("phase") == "planning"
        ),
        30,
        "the planner restarted",
    )
    # An operator's scale of a planned pool would be undone: refused unless forced.
    refused = cli("scale", "agg=2", timeout=30)
    assert refused.returncode == 1
    assert (
        f"pool 'agg' is sized by the planner (recipe `planner:`, 1 to {BUDGET + 1}"
        in refused.stderr
    )
    assert "`dynamoctl scale agg=2 --force`" in refused.stderr
    forced = cli("scale", "agg=1", "--force", timeout=30)
    assert forced.returncode == 0, forced.stderr
    assert "nothing to change" in forced.stdout and "may change it" in forced.stderr
    # With the planner drained, nothing undoes a scale: accepted as on any pool.
    assert cli("drain", "planner-0", timeout=60).returncode == 0
    unplanned = cli("scale", "agg=1", timeout=30)
    assert unplanned.returncode == 0 and "note" not in unplanned.stderr, unplanned.stderr
    down = cli("down", "planned", timeout=90)
    assert down.returncode == 0, down.stderr
