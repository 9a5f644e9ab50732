"""The model staged onto every node of a Slurm allocation with real ``sbcast`` before the
engines start (recipe ``model.cache.stage_ahead``, docs/operations.md "Slurm: sbcast"):
three named nodes, each with a node-local disk of its own at the cache's path (its slurmd
and its steps in a mount namespace), a mocker gang of two nodes served by ``dynamoctl up``
from the login host. Every node of the allocation ends with an entry checked against the
shared model's checksums; the gang's members start from their node's copy (a hit); a
second ``up`` on the same nodes broadcasts nothing."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.fixtures import _require_slurm
from tests.infra.model_dir import model_dir
from tests.infra.slurm_cluster import MultiNodeCluster, multinode_cluster
from tests.slurm.test_multinode_up import Login, _tail, _wait_gone

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.gang,
    pytest.mark.fast_start,
    pytest.mark.timeout(420),
]

NODE_LOCAL = Path("/tmp/dynamoctl-node-local")
"""What every node sees as its own disk (each node's is a directory of the cluster's)."""
SHARD = "model-00003-of-00004.safetensors"


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiNodeCluster]:
    _require_slurm()
    root = tmp_path_factory.mktemp("sb")  # short: slurmstepd's sockets live under it
    with multinode_cluster(root, nodes=3, node_local=NODE_LOCAL) as cluster:
        yield cluster


def _recipe(tmp: Path, cluster: MultiNodeCluster, source: Path) -> Path:
    path = tmp / "sbc.yaml"
    path.write_text(f"""\
schema: 1
name: sbc
discovery: {{backend: etcd, managed: true, lease_ttl: 4}}
target: {{kind: slurm, partition: {cluster.partition}, nodes: 3, gpus_per_node: 2,
         time_limit: "00:20:00"}}
model:
  name: mock-llama
  path: mock-llama
  block_size: 16
  cache: {{dir: {NODE_LOCAL / "models"}, verify: checksums, stage_ahead: true}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{port: 8004}}
workers:
  agg: {{engine: mocker, replicas: 1, nodes_per_replica: 2, gpus_per_replica: 4,
        engine_args: {{num-gpu-blocks: 256, speedup-ratio: 10, collective-timeout: 60,
                      weights-model: {source}}}}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, hang_timeout: 4, drain_timeout: 10}}
""")
    return path


def _manifests(cluster: MultiNodeCluster) -> dict[str, dict[str, object]]:
    """Each node's cache entries' manifests, read from its own disk."""
    found = {}
    for node in cluster.nodes:
        own = cluster.root / f"node-local-{node}" / "models"
        [manifest] = own.glob("*/manifest.json")
        found[node] = json.loads(manifest.read_bytes())
        found[node]["entry"] = str(manifest.parent)
    return found


def _up(login: Login, recipe: Path, home: Path) -> float:
    began = time.monotonic()
    up = login.cli("up", str(recipe), timeout=200)
    log = home / "runs" / "sbc" / "supervisor.log"
    assert up.returncode == 0, up.stdout + up.stderr + _tail(log)
    rows = {row["name"]: row for row in login.status("sbc")["instances"]}
    assert rows["agg-0"]["state"] == rows["agg-0.1"]["state"] == "READY", rows
    return time.monotonic() - began


def _down(login: Login) -> None:
    down = login.cli("down", "sbc", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    _wait_gone("sbc")


def test_sbcast_stages_every_node_once_and_a_restart_broadcasts_nothing(
    three_nodes: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster = three_nodes
    source = model_dir(tmp_path / "shared" / "m", 32 << 20)
    want = hashlib.sha256((source / SHARD).read_bytes()).hexdigest()
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, cluster, source)
    log = home / "runs" / "sbc" / "supervisor.log"
    try:
        first_s = _up(login, recipe, home)
        text = log.read_text()
        staged = re.search(r"sbcast to the job's nodes \(missing on ([^)]*)\)", text)
        assert staged is not None, _tail(log)
        missing = staged.group(1).split(", ")
        assert len(missing) == 2 and set(missing) < set(cluster.nodes)  # all but the first
        first = _manifests(cluster)
        for node, manifest in first.items():
            assert manifest["node"] == node  # adopted as the node's own entry
            assert manifest["source"] == str(source)
            sums = {f["path"]: f["sha256"] for f in manifest["files"]}  # type: ignore[attr-defined]
            assert sums[SHARD] == want
            copy = Path(str(manifest["entry"])) / "model" / SHARD
            assert hashlib.sha256(copy.read_bytes()).hexdigest() == want
        for member in ("agg-0", "agg-0.1"):  # the engines start from their node's copy
            member_log = (home / "runs" / "sbc" / "logs" / f"{member}.log").read_text()
            assert "from the node cache (hit" in member_log, member_log[-2000:]
    finally:
        _down(login)
    try:
        again_s = _up(login, recipe, home)
        text = log.read_text()
        assert "already in the cache on all 3 nodes" in text, _tail(log)
        assert _manifests(cluster) == first  # nothing copied, nothing rewritten
    finally:
        _down(login)
    print(f"\nsbcast staging: first up {first_s:.1f} s, second up {again_s:.1f} s")
