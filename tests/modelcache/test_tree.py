"""Coordinated staging over real SSH hosts: ``python -m dynamoctl.launch.stage RECIPE``
stages the model onto four sshd hosts (network namespaces, each with a node-local
directory of its own at the cache's path) with one read of the shared path in all: each
host that has the model serves one that has not (docs/operations.md, "Coordinated
staging"). A peer that cannot serve costs a read of the shared path, not the staging."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.modelcache.cache import NodeCache
from dynamoctl.modelcache.tree import waves
from dynamoctl.settings.model_cache import ModelCacheSettings
from tests.infra.model_dir import model_dir
from tests.infra.ssh_hosts import ssh_hosts, tree_python
from tests.supervisor.conftest import free_port

pytestmark = pytest.mark.fast_start

MIB = 1 << 20


def test_the_nodes_holding_the_model_double_each_wave() -> None:
    assert waves(["a"]) == [[(None, "a")]]
    assert waves(["a", "b", "c", "d", "e"]) == [
        [(None, "a")],
        [("a", "b")],
        [("a", "c"), ("b", "d")],
        [("a", "e")],
    ]
    nodes = [f"n{i}" for i in range(16)]
    plan = waves(nodes)
    assert len(plan) == 5  # the first copy, then log2(16) waves
    assert sorted(node for wave in plan for _, node in wave) == sorted(nodes)
    assert [peer for peer, _ in plan[0]] == [None]  # one read of the shared path in all


def test_a_peer_that_cannot_serve_costs_a_read_of_the_shared_path(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 2 * MIB)
    cache = NodeCache(ModelCacheSettings(dir=str(tmp_path / "cache")), node="node-b")
    entry = cache.stage(source, peer="http://127.0.0.1:9/")  # nothing listens on port 9
    assert (entry.hit, entry.origin) == (False, "shared")
    assert entry.manifest.bytes == sum(p.stat().st_size for p in source.iterdir())


def test_four_ssh_hosts_are_staged_with_one_read_of_the_shared_path(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 64 * MIB)
    local = tmp_path / "local-disk"  # each host's own directory is mounted here
    (tmp_path / "hosts").mkdir()
    with ssh_hosts(4, tmp_path / "hosts", node_local=local) as hosts:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(f"""\
schema: 1
name: tree
discovery: {{backend: etcd, managed: true}}
{hosts.target_yaml(tmp_path, tree_python(tmp_path))}
model: {{name: m, path: {source}, cache: {{dir: {local / "cache"}, verify: checksums}}}}
workers:
  agg: {{engine: mocker, replicas: 4}}
""")
        stage = [sys.executable, "-m", "dynamoctl.launch.stage", str(recipe)]
        done = subprocess.run(stage, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        again = subprocess.run(stage, capture_output=True, text=True, timeout=300)
    staged = result["staged"]
    assert sorted(staged) == sorted(hosts.names)
    froms = [staged[name]["from"] for name in hosts.names]
    assert froms[0] == "shared"
    assert all(f.startswith("peer http://") for f in froms[1:]), froms  # served, not read
    assert froms[1] == f"peer http://{hosts.addresses[0]}:29480/"
    assert not any(staged[name]["hit"] for name in hosts.names)
    shard = "model-00001-of-00004.safetensors"
    want = hashlib.sha256((source / shard).read_bytes()).hexdigest()
    for i, name in enumerate(hosts.names):  # each host's own disk holds a whole copy
        [manifest_file] = (tmp_path / "hosts" / f"node-local-{i}" / "cache").glob("*/manifest.json")
        manifest = json.loads(manifest_file.read_bytes())
        assert manifest["node"] == name
        assert {f["path"]: f["sha256"] for f in manifest["files"]}[shard] == want
        copy = manifest_file.parent / "model" / shard
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == want
    assert not list(local.iterdir())  # nothing landed on the machine's own path
    assert again.returncode == 0, again.stderr
    assert all(v["hit"] for v in json.loads(again.stdout)["staged"].values())


@pytest.mark.timeout(300)
def test_up_stages_the_workers_hosts_through_the_tree_before_they_start(tmp_path: Path) -> None:
    """``model.cache.stage_ahead``: ``up`` runs the same coordinated staging over its SSH
    hosts before any engine starts, and every worker starts from its host's copy."""
    source = model_dir(tmp_path / "shared" / "m", 16 * MIB)
    local = tmp_path / "local-disk"
    (tmp_path / "hosts").mkdir()
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp_path / "home")}
    run_dir = tmp_path / "home" / "runs" / "ahead"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "dynamoctl", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)

    with ssh_hosts(3, tmp_path / "hosts", node_local=local) as hosts:
        recipe = tmp_path / "ahead.yaml"
        recipe.write_text(f"""\
schema: 1
name: ahead
discovery: {{backend: etcd, managed: true, lease_ttl: 3}}
{hosts.target_yaml(tmp_path, tree_python(tmp_path))}
model:
  name: mock-llama
  path: mock-llama
  block_size: 16
  cache: {{dir: {local / "cache"}, verify: checksums, stage_ahead: true}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{host: 0.0.0.0, port: {free_port()}}}
workers:
  agg: {{engine: mocker, replicas: 3, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 256, speedup-ratio: 10, weights-model: {source}}}}}
supervision: {{probe_interval: 0.3}}
""")
        try:
            up = cli("up", str(recipe), "--detach")
            log = (run_dir / "supervisor.log").read_text()
            assert up.returncode == 0, up.stdout + up.stderr + log[-3000:]
            rows = json.loads(cli("status", "ahead", "--json").stdout)["instances"]
            workers = {r["name"]: (r["host"], r["state"]) for r in rows if r["pool"] == "agg"}
            assert sorted(workers.values()) == [(h, "READY") for h in sorted(hosts.names)]
            [line] = [ln for ln in log.splitlines() if "staged ahead on 3 hosts" in ln]
            assert line.count("'shared'") == 1 and line.count("'peer http://") == 2, line
            for worker in workers:  # each engine started from its host's copy
                text = (run_dir / "logs" / f"{worker}.log").read_text()
                assert "from the node cache (hit" in text, text[-2000:]
        finally:
            cli("down", "ahead", "--now")
    want = hashlib.sha256((source / "model-00001-of-00004.safetensors").read_bytes()).hexdigest()
    for i, name in enumerate(hosts.names):
        [manifest_file] = (tmp_path / "hosts" / f"node-local-{i}" / "cache").glob("*/manifest.json")
        manifest = json.loads(manifest_file.read_bytes())
        assert manifest["node"] == name
        sums = {f["path"]: f["sha256"] for f in manifest["files"]}
        assert sums["model-00001-of-00004.safetensors"] == want
