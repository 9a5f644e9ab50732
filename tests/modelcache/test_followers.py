"""Every node of a multi-node replica reads the model from its own cache: the plan gives
each follower ``model.cache``'s flags, and ``dynamoctl follower`` stages its node before
it waits for the leader (docs/operations.md, "Model cache")."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.wire.engine_args import parse_engine_args
from tests.infra.model_dir import model_dir
from tests.infra.ports import free_port

pytestmark = pytest.mark.fast_start

RECIPE = """\
schema: 1
name: g
discovery: {backend: etcd, managed: true}
target: {kind: slurm, partition: gpu, nodes: 4, gpus_per_node: 8}
model: {name: m, path: /shared/m, cache: {dir: /local/models, max_bytes: 500000000000}}
workers:
  agg: {engine: vllm, replicas: 2, nodes_per_replica: 2, gpus_per_replica: 16,
        engine_args: {tensor-parallel-size: 16}}
"""


def test_every_member_of_a_gang_gets_the_cache_flags() -> None:
    recipe = load_recipe_text(RECIPE, "r.yaml")
    allocation = [f"n{i}" for i in range(4)]
    resolve = {name: f"192.0.2.{i + 1}" for i, name in enumerate(allocation)}
    plan, _ = build_plan(recipe, Path("/run"), allocation, resolve)
    members = plan.by_pool("agg")
    assert [s.component for s in members] == ["worker", "follower"] * 2
    for spec in members:
        own = spec.argv[: spec.argv.index("--")] if "--" in spec.argv else spec.argv
        at = own.index("--model-cache-dir")
        assert own[at + 1] == "/local/models", (spec.name, own)
        assert own[own.index("--model-cache-max-bytes") + 1] == "500000000000"
    follower = members[1]
    engine = parse_engine_args(follower.argv[follower.argv.index("--") + 1 :])
    assert engine["model"] == "/shared/m"  # the follower points it at its copy itself


def test_a_follower_stages_its_node_before_it_waits_for_the_leader(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 4 << 20)
    cache = tmp_path / "node-b-cache"
    argv = [sys.executable, "-m", "dynamoctl", "follower", "--engine", "mocker"]
    argv += ["--label", "agg-0.1", "--rendezvous", f"127.0.0.1:{free_port()}"]
    argv += ["--rendezvous-timeout", "1", "--model-cache-dir", str(cache)]
    argv += ["--", "--weights-model", str(source), "--nnodes", "2", "--node-rank", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    # no leader listens: it exits 2 naming the rendezvous, after staging its own node
    assert done.returncode == 2, done.stderr
    assert "cannot reach the leader's rendezvous" in done.stderr
    [manifest_file] = cache.glob("*/manifest.json")
    manifest = json.loads(manifest_file.read_bytes())
    assert manifest["source"] == str(source)
    assert manifest["bytes"] == sum(p.stat().st_size for p in source.iterdir())
    assert f"weights from cache ({manifest_file.parent / 'model'})" in done.stderr


def test_a_follower_whose_staging_fails_exits_naming_node_and_reason(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache should be")
    source = model_dir(tmp_path / "shared" / "m", 1 << 20)
    argv = [sys.executable, "-m", "dynamoctl", "follower", "--engine", "mocker"]
    argv += ["--label", "agg-0.1", "--rendezvous", f"127.0.0.1:{free_port()}"]
    argv += ["--model-cache-dir", str(blocked), "--", "--weights-model", str(source)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"agg-0.1: staging {source} on node {socket.gethostname()} failed" in done.stderr
    assert "cannot make" in done.stderr
