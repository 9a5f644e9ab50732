"""Multi-node replicas on a real multi-node Slurm cluster: two mocker gangs of two nodes
each (every member its own ``srun`` step on its own named node), served by ``dynamoctl
up`` from the login host. A follower SIGKILLed on its node restarts its whole gang once
while a client on the login host keeps sending requests: none fails, the other gang takes
them. Start-to-ready and restart times are printed (figures, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.infra.fixtures import _require_slurm
from tests.infra.slurm_cluster import MultiNodeCluster, multinode_cluster
from tests.slurm.test_multinode_up import Login, _netns, _tail, _wait_gone

pytestmark = [pytest.mark.multinode, pytest.mark.gang, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiNodeCluster]:
    """Four named compute nodes (``gpu:2`` each): two gangs of two whole nodes."""
    _require_slurm()
    # A short directory: slurmstepd's unix sockets live under it, at most 108 bytes.
    with multinode_cluster(tmp_path_factory.mktemp("sg"), nodes=4) as cluster:
        yield cluster


def _recipe(tmp: Path, name: str, cluster: MultiNodeCluster, port: int) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: etcd, managed: true, lease_ttl: 4}}
target: {{kind: slurm, partition: {cluster.partition}, nodes: 4, gpus_per_node: 2,
         time_limit: "00:20:00"}}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{port: {port}}}
workers:
  agg: {{engine: mocker, replicas: 2, nodes_per_replica: 2, gpus_per_replica: 4,
        engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10, collective-timeout: 60}}}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, hang_timeout: 4, drain_timeout: 10}}
""")
    return path


def _in_cluster(pid: int, cluster: MultiNodeCluster) -> bool:
    """Whether ``pid`` runs in one of ``cluster``'s network namespaces: other tests' gangs
    (the other serial lane, another checkout) have followers of the same labels."""
    try:
        own = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False  # gone meanwhile
    return any(
        os.stat(f"/run/netns/{host.namespace}").st_ino == own for host in cluster.network.hosts
    )


def _followers(cluster: MultiNodeCluster) -> list[psutil.Process]:
    """The follower processes themselves (not their keepers, nor the sruns that started
    them) on ``cluster``'s nodes."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        line = proc.info["cmdline"] or []
        if (
            proc.info["status"] != psutil.STATUS_ZOMBIE
            and line[1:4] == ["-m", "dynamoctl", "follower"]
            and _in_cluster(proc.pid, cluster)
        ):
            found.append(proc)
    return found


def _follower(label: str, cluster: MultiNodeCluster) -> psutil.Process:
    (proc,) = [
        proc
        for proc in _followers(cluster)
        if f"--label {label} " in " ".join(proc.info["cmdline"] or [])
    ]
    return proc


def _rows(login: Login, name: str) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in login.status(name)["instances"]}


def test_a_killed_follower_restarts_its_gang_once_with_no_failed_request(
    four_nodes: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster, name = four_nodes, "gangup"
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, name, cluster, 8002)
    started = time.monotonic()
    try:
        up = login.cli("up", str(recipe), timeout=150)
    except subprocess.TimeoutExpired:
        jobs = login.run("scontrol", "show", "job").stdout
        log = _tail(home / "runs" / name / "supervisor.log")
        raise AssertionError(f"up timed out:\n{jobs}\n{log}\n{cluster.log_tails(40)}") from None
    up_s = time.monotonic() - started
    assert up.returncode == 0, (
        up.stdout + up.stderr + _tail(home / "runs" / name / "supervisor.log")
    )
    endpoint = f"http://{cluster.nodes[0]}:8002/v1"
    stop_file = tmp_path / "stop-load"
    load: subprocess.Popen[str] | None = None
    try:
        rows = _rows(login, name)
        members = ("agg-0", "agg-0.1", "agg-1", "agg-1.1")
        assert {n: rows[n]["state"] for n in members} == dict.fromkeys(members, "READY")
        hosts = [rows[n]["host"] for n in members]
        assert sorted(hosts) == sorted(cluster.nodes)  # four whole nodes, one member each
        squeue = login.run("squeue", "-s", "-h", "-o", "%j %N")
        assert f"dynamoctl:agg-0.1 {rows['agg-0.1']['host']}" in squeue.stdout, squeue.stdout

        load = login.start_load(endpoint, stop_file, seconds=180)
        time.sleep(2.0)
        victim = _follower("agg-0.1", cluster)
        assert _netns(victim.pid) != _netns(_follower("agg-1.1", cluster).pid)
        killed_at = time.monotonic()
        victim.kill()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = _rows(login, name)
            if rows["agg-0"]["restarts"] == 1 and all(
                rows[n]["state"] == "READY" for n in ("agg-0", "agg-0.1")
            ):
                break
            time.sleep(0.3)
        restart_s = time.monotonic() - killed_at
        assert rows["agg-0"]["restarts"] == 1 and rows["agg-0.1"]["state"] == "READY", rows
        assert "gang member agg-0.1" in rows["agg-0"]["message"]
        assert rows["agg-1"]["restarts"] == 0
        time.sleep(1.0)
    finally:
        stop_file.touch()
        out = load.communicate(timeout=120)[0] if load is not None else ""
        down = login.cli("down", name, timeout=180)
    result = json.loads(out)
    assert result["errors"] == [] and result["done"] > 0, result
    print(
        f"\nslurm gang figures: up (login host) -> serving {up_s:.1f} s; follower SIGKILL -> "
        f"gang READY again {restart_s:.1f} s; {result['done']} requests, 0 failed"
    )
    assert down.returncode == 0, down.stdout + down.stderr
    _wait_gone(name)
    deadline = time.monotonic() + 30  # followers name no deployment: found on its nodes
    while _followers_left(cluster) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _followers_left(cluster) == []


def _followers_left(cluster: MultiNodeCluster) -> list[str]:
    return [" ".join(proc.info["cmdline"] or [])[:200] for proc in _followers(cluster)]
