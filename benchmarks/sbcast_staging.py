"""A Slurm allocation staged with ``sbcast`` (recipe ``model.cache.stage_ahead``) against one
``srun`` step per node each copying from the shared path, side by side.

    flock /tmp/dynamoctl-cluster.lock python benchmarks/sbcast_staging.py \
        [--model-mib 512] [--nodes 4] [--rounds 3] [--out FILE]

Run from the repository root with ``PYTHONPATH=$PWD`` (it uses the tests' Slurm cluster,
tests/infra/slurm_cluster.py): ``--nodes`` named Slurm nodes (namespaces), each with its
own node-local directory at one path (its slurmd and its steps in a mount namespace); one
allocation over all of them; a generated checkpoint (tests/infra/model_dir.py) on this
machine's disk as the "shared path". Every round empties every node's cache, then runs
the two arms in alternating order:

- ``sbcast_s``: :func:`dynamoctl.launch.slurm.sbcast.stage_allocation`, what ``up`` runs:
  this host stages its copy (one read of the shared path), a probe step, ``sbcast`` of
  each file to every node, a step that checks every file's SHA-256 on each node and adopts
  it. Reads of the shared path: 1.
- ``per_node_s``: one step with a task per node, each ``python -m dynamoctl.modelcache``
  copying from the shared path (what a node's first worker does). Reads: one per node.

The shared path here is the same local disk as the nodes' caches (no network between
them), so this measures what the broadcast costs, not what it saves a shared filesystem:
the saving is the reads (1 against N), which a throttled link turns into time
(benchmarks/fast_start.py measures that for the copies and the tree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine

from dynamoctl.launch.slurm.jobs import step_env
from dynamoctl.launch.slurm.sbcast import stage_allocation
from dynamoctl.settings.model_cache import ModelCacheSettings
from tests.infra.model_dir import model_dir
from tests.infra.slurm_cluster import MultiNodeCluster, multinode_cluster
from tests.slurm.conftest import allocate

NODE_LOCAL = Path("/tmp/dynamoctl-node-local-bench")


def empty_caches(cluster: MultiNodeCluster) -> None:
    for node in cluster.nodes:
        shutil.rmtree(cluster.root / f"node-local-{node}" / "models", ignore_errors=True)
    shutil.rmtree(NODE_LOCAL / "models", ignore_errors=True)  # this host's (the sender's)


def sbcast_s(cluster: MultiNodeCluster, job: str, source: Path) -> float:
    settings = ModelCacheSettings(dir=str(NODE_LOCAL / "models"), verify="checksums")
    env = step_env(cluster.env)
    began = time.monotonic()
    report = asyncio.run(
        stage_allocation(job, cluster.nodes, [str(source)], settings, env=env,
                         step_args=[sys.executable])
    )  # fmt: skip
    elapsed = time.monotonic() - began
    found = report["sources"][str(source)]
    assert found["broadcast"] and len(found["missing"]) == len(cluster.nodes), found
    print(f"  sbcast: {elapsed:.1f} s (of which sbcast {found['sbcast_s']:.1f} s)", flush=True)
    return elapsed


def per_node_s(cluster: MultiNodeCluster, job: str, source: Path) -> float:
    argv = ["srun", f"--jobid={job}", f"--nodes={len(cluster.nodes)}", "--ntasks-per-node=1"]
    argv += ["--overlap", sys.executable, "-m", "dynamoctl.modelcache", str(source)]
    argv += ["--model-cache-dir", str(NODE_LOCAL / "models")]
    began = time.monotonic()
    out = cluster.run(*argv, timeout=1800)
    elapsed = time.monotonic() - began
    copies = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(copies) == len(cluster.nodes) and not any(c["hit"] for c in copies), out
    print(f"  per node: {elapsed:.1f} s", flush=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-mib", type=int, default=512)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/sbcast_staging.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {"sbcast": [], "per_node": []}
    with tempfile.TemporaryDirectory(prefix="sbc", dir="/tmp") as tmp:
        source = model_dir(Path(tmp) / "shared" / "m", args.model_mib << 20)
        with (
            multinode_cluster(Path(tmp), nodes=args.nodes, node_local=NODE_LOCAL) as cluster,
            allocate(cluster, Path(tmp) / "job.out", f"--nodes={args.nodes}") as job,
        ):
            for round_ in range(args.rounds):
                arms = [("sbcast", sbcast_s), ("per_node", per_node_s)]
                for name, arm in arms if round_ % 2 == 0 else arms[::-1]:
                    empty_caches(cluster)
                    runs[name].append(round(arm(cluster, job, source), 3))
    result: dict[str, Any] = {
        "sbcast_s": statistics.median(runs["sbcast"]),
        "per_node_s": statistics.median(runs["per_node"]),
        "shared_reads": {"sbcast": 1, "per_node": args.nodes},
        "runs": runs,
        "setup": {"model_mib": args.model_mib, "nodes": args.nodes, "rounds": args.rounds},
        "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "machine": machine(),
    }
    result["ratio_sbcast_to_per_node"] = round(result["sbcast_s"] / result["per_node_s"], 3)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))


if __name__ == "__main__":
    main()
