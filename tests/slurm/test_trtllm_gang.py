"""A TensorRT-LLM gang's launch on a real Slurm cluster: its MPI world needs ``srun
--mpi=pmix`` to work on the nodes, and preflight says so before anything starts, naming
the node and Slurm's own error. On this project's test cluster (Slurm 22.05.8, Debian)
the ``pmix`` plugin is listed but the PMIx library is missing, so the refusal is what is
checked there; where a PMIx step runs, preflight must pass (docs/engines.md)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from dynamoctl.launch.api import InstanceSpec, LaunchError
from dynamoctl.launch.slurm import MPI_PLUGIN, SlurmLauncher
from tests.infra.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.gang


def _world(nodes: list[str]) -> InstanceSpec:
    return InstanceSpec(
        name="agg-0",
        pool="agg",
        component="worker",
        host=nodes[0],
        argv=["trtllm-llmapi-launch", sys.executable, "-m", "dynamoctl", "worker"],
        gang="agg-0",
        nnodes=len(nodes),
        mpi_nodes=nodes,
        mpi_tasks_per_node=1,
    )


def test_preflight_checks_the_mpi_world_can_be_started(
    slurm: SlurmCluster, allocation: str
) -> None:
    probe = subprocess.run(
        ["srun", f"--jobid={allocation}", "-N1", "-n1", "--overlap", f"--mpi={MPI_PLUGIN}", "true"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    if probe.returncode == 0:
        asyncio.run(launcher.preflight([_world([slurm.node])]))
    else:
        with pytest.raises(LaunchError) as error:
            asyncio.run(launcher.preflight([_world([slurm.node])]))
        said = str(error.value)
        assert f"agg-0: TensorRT-LLM's MPI world needs `srun --mpi=pmix` on {slurm.node}" in said
        assert probe.stderr.strip().splitlines()[0] in said  # Slurm's own first line
    with pytest.raises(LaunchError, match=r"agg-0: host 'gpu-node-17' is not a node of Slurm"):
        asyncio.run(launcher.preflight([_world([slurm.node, "gpu-node-17"])]))
