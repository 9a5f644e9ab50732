"""Staging a model onto every node of a Slurm allocation before anything starts: one
``srun`` step with a task per node runs ``python -m dynamoctl.modelcache`` on each (the
"ahead of time" path of docs/operations.md, "Model cache"). The cluster's nodes are
namespaces sharing this machine's disk, so each gets its own cache directory, named by its
hostname, as a node-local disk would be."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.infra.model_dir import model_dir
from tests.infra.slurm_cluster import MultiNodeCluster

pytestmark = [pytest.mark.multinode, pytest.mark.fast_start]


def stage_everywhere(
    cluster: MultiNodeCluster, source: Path, base: Path
) -> list[dict[str, object]]:
    stage = f"exec {sys.executable} -m dynamoctl.modelcache {source}"
    script = stage + f' --model-cache-dir "{base}/$(hostname)"'
    out = cluster.run(
        "srun",
        f"--nodes={len(cluster.nodes)}",
        "--ntasks-per-node=1",
        "sh",
        "-c",
        script,
        timeout=180,
    )
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_one_step_stages_every_node_once(slurm_multinode: MultiNodeCluster, tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "model", 8 << 20)
    base = tmp_path / "node-local"
    first = stage_everywhere(slurm_multinode, source, base)
    assert sorted(str(o["node"]) for o in first) == sorted(slurm_multinode.nodes)
    assert all(o["hit"] is False for o in first)
    for node in slurm_multinode.nodes:
        [manifest] = (base / node).glob("*/manifest.json")
        assert json.loads(manifest.read_bytes())["node"] == node
    again = stage_everywhere(slurm_multinode, source, base)
    assert all(o["hit"] is True for o in again)
