"""A real single-node Slurm cluster for the session, and allocations in it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.slurm_cluster import SlurmCluster, missing_binaries, slurm_cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.fail(
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld "
            "slurmd slurm-client munge (scripts/install-deps.sh does this)"
        )
    if os.geteuid() != 0:
        pytest.fail("the Slurm tests start slurmd, which needs root")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@contextlib.contextmanager
def allocate(slurm: SlurmCluster, out: Path, *sbatch: str) -> Iterator[str]:
    """A running batch job that only holds its allocation; cancelled and gone afterwards."""
    job = slurm.run(
        "sbatch", "--parsable", "--time=10:00", f"--output={out}", *sbatch, "--wrap", "sleep 600"
    ).strip()
    try:
        wait_job_state(slurm, job, {"RUNNING"})
        yield job
    finally:
        slurm.run("scancel", job, check=False)
        wait_job_state(slurm, job, {"", "CANCELLED", "COMPLETED", "FAILED"})


def wait_job_state(slurm: SlurmCluster, job: str, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        state = slurm.run("squeue", f"--jobs={job}", "-h", "-o", "%T", check=False).strip()
        if state in states:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} is {state}, not {states}, after {timeout} s")


@pytest.fixture
def allocation(slurm: SlurmCluster, tmp_path: Path) -> Iterator[str]:
    """The id of a fresh, running one-node allocation."""
    with allocate(slurm, tmp_path / "allocation.out") as job:
        yield job
