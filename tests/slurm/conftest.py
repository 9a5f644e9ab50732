"""Helpers for tests on the Slurm clusters (the clusters and allocations are session
fixtures of every test directory: tests/infra/fixtures.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from tests.infra.slurm_cluster import SlurmCluster


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
