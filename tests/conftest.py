"""Fixtures shared by the whole suite: real servers, started and reaped by the tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from dynamoctl.discovery.etcd_server import ManagedEtcd

# The Slurm clusters: one of each kind for the whole session, whichever directory asks.
pytest_plugins = ["tests.infra.fixtures"]


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[ManagedEtcd]:
    """A real etcd 3.x server on 127.0.0.1, shared by the session (tests use own prefixes)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: apt-get install etcd-server (.ci/run does this)")
    with ManagedEtcd() as server:
        yield server
