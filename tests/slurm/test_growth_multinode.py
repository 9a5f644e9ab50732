"""Growing beyond the allocation on the real multi-node Slurm cluster (recipe
``target.growth``): a two-node allocation full of replicas, ``scale`` past it submits a
second job (squeue shows it) whose replica registers and serves, the growth budget bounds
it, and the scale back down drains that replica, then cancels the job; a client on the
login host sends requests all along and none fails."""

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
from tests.slurm.test_multinode_up import Login, _tail, _wait_gone

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(420)]


def _recipe(tmp: Path, name: str, cluster: MultiNodeCluster, port: int, growth: str = "") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: etcd, managed: true, lease_ttl: 4}}
target:
  kind: slurm
  partition: {cluster.partition}
  nodes: 2
  gpus_per_node: 2
  time_limit: "00:20:00"
  growth: {{{growth or "max_jobs: 1, nodes_per_job: 1, start_timeout: 90"}}}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{port: {port}}}
workers:
  agg: {{engine: mocker, replicas: 2, gpus_per_replica: 2,
        engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10}}}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, drain_timeout: 10}}
""")
    return path


def _requests_served(login: Login, home: Path, name: str, instance: str) -> float:
    """The worker's own count of requests it served: its /metrics, at the address its
    log announces on its node."""
    log = (home / "runs" / name / "logs" / f"{instance}.log").read_text()
    (url,) = re.findall(r"metrics on (http://\S+/metrics)", log)[-1:]
    text = login.get(url)
    counts = re.findall(r"^dynamoctl_worker_requests_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(map(float, counts))


def _growth(login: Login, name: str) -> list[dict[str, Any]]:
    return login.status(name)["growth"]  # type: ignore[no-any-return]


def test_scale_past_the_allocation_grows_by_a_job_and_releases_it_drained(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster, name = slurm_multinode, "grow"
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, name, cluster, 8011)
    up = login.cli("up", str(recipe), timeout=240)
    assert up.returncode == 0, (
        up.stdout + up.stderr + _tail(home / "runs" / name / "supervisor.log")
    )
    main_job = (home / "runs" / name / "slurm-job").read_text().strip()
    endpoint = f"http://{cluster.nodes[0]}:8011/v1"
    stop_file = tmp_path / "stop-load"
    load: subprocess.Popen[str] | None = None
    figures: dict[str, float] = {}
    try:
        rows = {r["name"]: r for r in login.status(name)["instances"]}
        allocation = {rows["agg-0"]["host"], rows["agg-1"]["host"]}
        assert len(allocation) == 2 and _growth(login, name) == []  # both nodes full
        load = login.start_load(endpoint, stop_file, seconds=240)

        started = time.monotonic()
        grown = login.cli("scale", "agg=3", "--name", name, timeout=200)
        figures["grow"] = time.monotonic() - started
        assert grown.returncode == 0, grown.stdout + grown.stderr
        match = re.search(r"submitted extra Slurm job (\d+)", grown.stdout)
        assert match, grown.stdout
        extra = match.group(1)
        assert extra != main_job
        (node,) = set(cluster.nodes) - allocation
        assert f"agg-2: READY on {node}" in grown.stdout, grown.stdout
        squeue = login.run("squeue", "-h", "-o", "%i %T %N").stdout
        assert f"{extra} RUNNING {node}" in squeue, squeue
        steps = login.run("squeue", "-s", "-h", "-o", "%i %j").stdout
        assert re.search(rf"^\s*{extra}\.\d+ dynamoctl:agg-2$", steps, re.M), steps
        (job,) = _growth(login, name)
        assert job == {"job": extra, "state": "RUNNING", "nodes": [node],
                       "replicas": ["agg-2"], "message": ""}  # fmt: skip
        table = login.cli("status", name)
        assert f"extra Slurm job {extra}: RUNNING on {node} for agg-2" in table.stdout
        control = json.loads((home / "runs" / name / "state.json").read_text())["control"]
        metrics = login.get(control.rstrip("/") + "/metrics")
        assert f'dynamoctl_supervisor_growth_jobs{{deployment="{name}",state="RUNNING"}} 1.0' in (
            metrics
        )

        # It serves: the router sends it its share of the client's requests.
        deadline = time.monotonic() + 30
        while _requests_served(login, home, name, "agg-2") < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _requests_served(login, home, name, "agg-2") >= 3

        # Bounded: a second extra job would pass target.growth.max_jobs.
        refused = login.cli("scale", "agg=4", "--name", name, timeout=60)
        assert refused.returncode == 1
        assert "growth budget is spent (target.growth.max_jobs=1" in refused.stderr

        started = time.monotonic()
        shrunk = login.cli("scale", "agg=2", "--name", name, timeout=120)
        assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
        assert "agg=2: draining agg-2" in shrunk.stdout
        assert f"agg-2: STOPPED on {node}" in shrunk.stdout
        wait_job_state(cluster, extra, {"", "CANCELLED"}, timeout=60)
        figures["release"] = time.monotonic() - started
        deadline = time.monotonic() + 20
        while _growth(login, name)[0]["state"] != "RELEASED" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert _growth(login, name)[0]["state"] == "RELEASED"
        log = (home / "runs" / name / "supervisor.log").read_text()
        drained = log.index("agg-2 on " + node + ": DRAINING -> STOPPED")
        assert drained < log.index(f"extra Slurm job {extra}: RUNNING -> RELEASING")
        assert login.complete(endpoint)["usage"]["completion_tokens"] == 4
    finally:
        stop_file.touch()
        out = load.communicate(timeout=120)[0] if load is not None else "{}"
        down = login.cli("down", name, timeout=180)
    result = json.loads(out)
    assert result["errors"] == [] and result["done"] > 0, result
    print(
        f"\nslurm growth figures: scale past the allocation -> replica READY on the extra "
        f"job's node {figures['grow']:.1f} s; scale back -> drained and job gone "
        f"{figures['release']:.1f} s; {result['done']} requests, 0 failed"
    )
    assert down.returncode == 0, down.stdout + down.stderr
    _wait_gone(name)


def test_extra_jobs_that_never_run_or_end_by_themselves_and_down_releasing_the_rest(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    """Two extra jobs allowed, but the cluster has one node left: the second waits in the
    queue past its start_timeout, is cancelled, and ``scale`` says so. The first, cancelled
    by hand, is noticed: its replica is stopped, not restarted into a gone job, and a new
    scale grows again; a scale-down while a third is queued withdraws it. ``down`` drains
    the grown replica, then cancels its job."""
    cluster, name = slurm_multinode, "growfail"
    home = tmp_path / "home"
    login = Login(cluster, home)
    growth = "max_jobs: 2, nodes_per_job: 1, start_timeout: 6"
    recipe = _recipe(tmp_path, name, cluster, 8012, growth)
    up = login.cli("up", str(recipe), timeout=240)
    assert up.returncode == 0, (
        up.stdout + up.stderr + _tail(home / "runs" / name / "supervisor.log")
    )
    try:
        grown = login.cli("scale", "agg=3", "--name", name, timeout=200)
        assert grown.returncode == 0, grown.stdout + grown.stderr
        first = re.search(r"submitted extra Slurm job (\d+)", grown.stdout)
        assert first, grown.stdout
        stuck = login.cli("scale", "agg=4", "--name", name, timeout=120)
        assert stuck.returncode == 1, stuck.stdout + stuck.stderr
        second = re.search(r"submitted extra Slurm job (\d+)", stuck.stdout)
        assert second, stuck.stdout
        assert (
            f"not started: agg-3 (extra Slurm job {second.group(1)} FAILED: still pending "
            "after target.growth.start_timeout=6 s)"
        ) in stuck.stderr
        wait_job_state(cluster, second.group(1), {"", "CANCELLED"}, timeout=30)
        jobs = {g["job"]: g["state"] for g in _growth(login, name)}
        assert jobs == {first.group(1): "RUNNING", second.group(1): "FAILED"}
        rows = {r["name"]: r["state"] for r in login.status(name)["instances"]}
        assert rows == {n: "READY" for n in ("etcd-0", "agg-0", "agg-1", "agg-2", "frontend-0")}
        assert login.complete(f"http://{cluster.nodes[0]}:8012/v1")["usage"]["completion_tokens"]

        login.run("scancel", first.group(1))  # not by dynamoctl: noticed, not restarted into
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = {r["name"]: r["state"] for r in login.status(name)["instances"]}
            if rows["agg-2"] == "STOPPED":
                break
            time.sleep(0.5)
        assert rows["agg-2"] == "STOPPED", rows
        (ended,) = [g for g in _growth(login, name) if g["job"] == first.group(1)]
        assert ended["state"] == "FAILED" and "ended by itself" in ended["message"], ended
        again = login.cli("scale", "agg=3", "--name", name, timeout=200)
        assert again.returncode == 0, again.stdout + again.stderr
        first = re.search(r"submitted extra Slurm job (\d+)", again.stdout)  # the one down ends
        assert first, again.stdout

        # A scale-down while an extra job is queued withdraws its replica and cancels it.
        queued = login.cli("scale", "agg=4", "--name", name, "--no-wait", timeout=60)
        third = re.search(r"submitted extra Slurm job (\d+)", queued.stdout)
        assert queued.returncode == 0 and third, queued.stdout + queued.stderr
        back = login.cli("scale", "agg=3", "--name", name, timeout=60)
        assert back.returncode == 0, back.stdout + back.stderr
        assert "agg=3: withdrawing (their extra Slurm job was still queued) agg-3" in back.stdout
        wait_job_state(cluster, third.group(1), {"", "CANCELLED"}, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            jobs = {g["job"]: g["state"] for g in _growth(login, name)}
            if jobs[third.group(1)] == "RELEASED":
                break
            time.sleep(0.3)
        assert jobs[third.group(1)] == "RELEASED", jobs
        assert jobs[first.group(1)] == "RUNNING"
    finally:
        down = login.cli("down", name, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    wait_job_state(cluster, first.group(1), {"", "CANCELLED"}, timeout=30)
    _wait_gone(name)
    log = (home / "runs" / name / "supervisor.log").read_text()
    drained = re.search(r"agg-2 on \S+: DRAINING -> STOPPED", log)
    assert drained, log[-3000:]
    assert drained.start() < log.index(f"extra Slurm job {first.group(1)}: RUNNING -> RELEASING")
