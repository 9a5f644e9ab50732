"""A TensorRT-LLM gang's launch on a real Slurm cluster: its MPI world needs ``srun
--mpi=pmix`` to work on the nodes, and preflight says so before anything starts, naming
the node and Slurm's own error. On this project's test cluster (Slurm 22.05.8, Debian)
the ``pmix`` plugin is listed but the PMIx library is missing, so the refusal is what is
checked there; where a PMIx step runs, preflight must pass (docs/engines.md)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import psutil
import pytest

from dynamoctl.launch.api import InstanceSpec, LaunchError, stop
from dynamoctl.launch.slurm.launcher import SlurmLauncher, list_steps
from tests.infra.slurm_cluster import MultiNodeCluster, SlurmCluster
from tests.slurm.conftest import allocate

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
        ["srun", f"--jobid={allocation}", "-N1", "-n1", "--overlap", "--mpi=pmix", "true"],
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
        assert (
            f"agg-0: TensorRT-LLM's MPI world needs `srun --mpi=pmix` (target.mpi) on {slurm.node}"
            in said
        )
        assert probe.stderr.strip().splitlines()[0] in said  # Slurm's own first line
    with pytest.raises(LaunchError, match=r"agg-0: host 'gpu-node-17' is not a node of Slurm"):
        asyncio.run(launcher.preflight([_world([slurm.node, "gpu-node-17"])]))


# A rank: says who and where it is, then waits; the marker lets the test find them all.
RANK = (
    "import os, socket, sys, time; "
    "print('rank', os.environ['SLURM_PROCID'], socket.gethostname(), sys.argv[1], flush=True); "
    "time.sleep(600)"
)


@pytest.mark.multinode
def test_an_mpi_world_is_one_step_over_its_nodes_and_ends_whole(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    """The launch shape of a TensorRT-LLM gang on two named nodes, with a stand-in for
    ``trtllm-llmapi-launch`` (TensorRT-LLM needs GPUs) and ``pmi2`` (this cluster has no
    PMIx library): one step, a keeper and a rank per task on every node, one log with
    each line's rank; one rank killed ends the whole step (``--kill-on-bad-exit``), which
    is what the supervisor sees as the gang's one exit."""
    cluster = slurm_multinode
    nodes = cluster.nodes[:2]
    marker = f"dyn-mpi-world-{uuid.uuid4().hex[:8]}"
    spec = msgspec.structs.replace(
        _world(nodes), argv=[sys.executable, "-c", RANK, marker], mpi_tasks_per_node=2
    )
    log = tmp_path / "agg-0.log"
    with allocate(cluster, tmp_path / "job.out", "-N2", "--ntasks-per-node=2") as job:
        launcher = SlurmLauncher(job_id=job, env=cluster.env, mpi="pmi2")

        async def run() -> tuple[set[str], int, list[str]]:
            await launcher.preflight([spec])
            step = await launcher.start(spec, log)
            try:
                await _until(lambda: len(_ranks(marker)) == 4, "four ranks running")
                lines = await _until_lines(log, 4)
                steps = await list_steps(job, cluster.env)
                named = [s for s, name in steps.items() if name == "dynamoctl:agg-0"]
                _ranks(marker)[-1].kill()  # one rank lost: Slurm ends the others, srun ends
                code = await asyncio.wait_for(step.wait(), 60)
            finally:
                await stop(step, 5)
            await _until(lambda: not _ranks(marker), "no rank left on any node")
            return set(lines), code, named

        lines, code, named = asyncio.run(run())
    assert len(named) == 1  # one job step for the whole world
    ranks = {line.split(": ", 1)[0].strip(): line for line in lines}
    assert sorted(ranks) == ["0", "1", "2", "3"], lines  # srun --label: the task's rank
    for rank, line in ranks.items():  # two ranks on each node, in node order
        assert f"rank {rank} {nodes[int(rank) // 2]} {marker}" in line, line
    assert code != 0


def _ranks(marker: str) -> list[psutil.Process]:
    """The stand-in ranks (not their keepers) still alive."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        argv = proc.info["cmdline"] or []
        alive = marker in argv and proc.info["status"] != psutil.STATUS_ZOMBIE
        if alive and "dynamoctl.launch.keeper" not in argv and "srun" not in argv[0]:
            found.append(proc)
    return found


async def _until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


async def _until_lines(log: Path, count: int) -> list[str]:
    def lines() -> list[str]:
        text = log.read_text(errors="replace") if log.exists() else ""
        return [line for line in text.splitlines() if " rank " in f" {line}"]

    await _until(lambda: len(lines()) >= count, f"{count} rank lines in {log}")
    return lines()
