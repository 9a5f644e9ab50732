"""Real Slurm clusters for the session (a single-node one on loopback, ``slurm``; a
multi-node one of named hosts, ``slurm_multinode``), and allocations in them. Registered
once for the whole suite (tests/conftest.py), so tests in any directory share one cluster
of each kind."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.slurm_cluster import (
    MultiNodeCluster,
    SlurmCluster,
    missing_binaries,
    multinode_cluster,
    slurm_cluster,
)
from tests.slurm.conftest import allocate


def _require_slurm() -> None:
    missing = missing_binaries()
    if missing:
        pytest.fail(
            f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld "
            "slurmd slurm-client munge (scripts/install-deps.sh does this)"
        )
    if os.geteuid() != 0:
        pytest.fail("the Slurm tests start slurmd, which needs root")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One node (this machine's name) on 127.0.0.1."""
    _require_slurm()
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_multinode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiNodeCluster]:
    """Three named compute nodes (``gpu:2`` each), a controller and a login host, each in
    its own network and UTS namespace on a private bridge (tests/infra/slurm_cluster.py).
    Tests using it carry ``@pytest.mark.multinode``."""
    _require_slurm()
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: apt-get install iproute2 util-linux")
    with multinode_cluster(tmp_path_factory.mktemp("mn"), nodes=3) as cluster:
        yield cluster


@pytest.fixture
def allocation(slurm: SlurmCluster, tmp_path: Path) -> Iterator[str]:
    """The id of a fresh, running one-node allocation."""
    with allocate(slurm, tmp_path / "allocation.out") as job:
        yield job
