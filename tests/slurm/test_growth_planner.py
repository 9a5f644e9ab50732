"""The planner, not an operator, grows a Slurm deployment past its allocation (issue 27,
item 3): on the real multi-node cluster a two-node allocation is full with two replicas;
under a client's load the planner's load loop asks for a third, which the supervisor
places in an extra Slurm job (squeue shows it, the replica serves); once the load stops
the planner takes it away, the replica drains and the job is released; the client sees
no failed request."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.infra.slurm_cluster import MultiNodeCluster
from tests.slurm.conftest import wait_job_state
from tests.slurm.test_growth_multinode import _growth, _recipe
from tests.slurm.test_multinode_up import Login, _tail, _wait_gone

pytestmark = [pytest.mark.multinode, pytest.mark.planner, pytest.mark.timeout(480)]

PLANNER = """\
planner:
  mode: load
  ttft_target_ms: 1.0      # any request's TTFT is over it: load alone calls for more
  itl_target_ms: 1000.0
  agg_min_replicas: 2
  agg_max_replicas: 3
  gpu_budget: 6            # three replicas of two GPUs
  load_interval: 1.0
  cooldown: 2.0
  stable_intervals: 2
"""


def _wait(login: Login, name: str, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        report = login.status(name)
        if predicate(report):
            return report
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {report}"
        time.sleep(1.0)


def _agg(report: dict[str, Any]) -> dict[str, str]:
    return {r["name"]: r["state"] for r in report["instances"] if r["pool"] == "agg"}


def test_the_planner_grows_into_an_extra_job_under_load_and_releases_it(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster, name = slurm_multinode, "plangrow"
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, name, cluster, 8013)
    recipe.write_text(recipe.read_text() + PLANNER)
    up = login.cli("up", str(recipe), timeout=240)
    assert up.returncode == 0, (
        up.stdout + up.stderr + _tail(home / "runs" / name / "supervisor.log")
    )
    main_job = (home / "runs" / name / "slurm-job").read_text().strip()
    endpoint = f"http://{cluster.nodes[0]}:8013/v1"
    stop_file = tmp_path / "stop-load"
    load: subprocess.Popen[str] | None = None
    try:
        report = _wait(
            login, name, lambda r: (r.get("planner") or {}).get("phase") == "planning", 60,
            "the planner planning",
        )  # fmt: skip
        allocation = {r["host"] for r in report["instances"] if r["pool"] == "agg"}
        assert len(allocation) == 2 and _growth(login, name) == []
        load = login.start_load(endpoint, stop_file, seconds=300)
        grown = _wait(login, name, lambda r: _agg(r).get("agg-2") == "READY", 200, "agg-2 READY")
        (job,) = _growth(login, name)
        (node,) = set(cluster.nodes) - allocation
        assert job["job"] != main_job and job["nodes"] == [node] and job["replicas"] == ["agg-2"]
        assert job["state"] == "RUNNING", job
        squeue = login.run("squeue", "-h", "-o", "%i %T %N").stdout
        assert f"{job['job']} RUNNING {node}" in squeue, squeue
        assert grown["planner"]["gpus"] <= 6

        stop_file.touch()  # idle: the planner takes the third replica away
        _wait(login, name, lambda r: _agg(r).get("agg-2") == "STOPPED", 120, "agg-2 drained")
        wait_job_state(cluster, job["job"], {"", "CANCELLED"}, timeout=60)
        _wait(login, name, lambda r: r["growth"][0]["state"] == "RELEASED", 30, "the job released")
        log = (home / "runs" / name / "logs" / "planner-0.log").read_text()
        print(log)  # the decisions and their inputs, shown when the test fails
        assert "load loop: agg 2 -> 3" in log and "load loop: agg 3 -> 2" in log
        assert re.search(r"scaled agg to 2: draining agg-2", log), log
        supervisor = (home / "runs" / name / "supervisor.log").read_text()
        drained = supervisor.index(f"agg-2 on {node}: DRAINING -> STOPPED")
        assert drained < supervisor.index(f"extra Slurm job {job['job']}: RUNNING -> RELEASING")
        assert _agg(login.status(name)) == {"agg-0": "READY", "agg-1": "READY", "agg-2": "STOPPED"}
    finally:
        stop_file.touch()
        out = load.communicate(timeout=120)[0] if load is not None else "{}"
        down = login.cli("down", name, timeout=180)

    result = json.loads(out)
    assert result["errors"] == [] and result["done"] > 0, result
    assert down.returncode == 0, down.stdout + down.stderr
    _wait_gone(name)
