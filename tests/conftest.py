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
    # Started with room for a loaded machine (etcd's own default waits 15 s).
    with ManagedEtcd().start(timeout=60) as server:
        yield server


# --- Which tests run alone (marker `serial`; `make test` runs them after the parallel part) --
# The rest run on several pytest-xdist workers at once (whole files per worker). A test is
# serial when it shares a session cluster (one per process: Slurm, sshd hosts), builds
# network namespaces or /etc/hosts names, starts vLLM (all cores, GiBs of memory), or
# asserts on wall-clock behaviour under a load it creates itself (etcd freezes against
# lease TTLs, planner load steps, throughput against a timing model).
_SERIAL_FIXTURES = frozenset({"slurm", "slurm_multinode", "allocation", "ssh_hosts2"})
_SERIAL_PATHS = (
    "tests/slurm/",
    "tests/launch/",
    "tests/gpu/",
    "tests/bench/",
    "tests/security/test_locked_ssh.py",
    "tests/engines/test_vllm_cpu.py",
    "tests/engines/test_vllm_cpu_gang.py",
    "tests/engines/test_vllm_lmcache_cpu.py",
    "tests/engines/test_vllm_nixl_cpu.py",
    "tests/engines/test_vllm_nixl_multinode.py",
    "tests/frontend/test_openai_clients.py",
    "tests/discovery/test_etcd_outage.py",
    "tests/discovery/test_stale_serving.py",
    "tests/supervisor/test_discovery_outage.py",
    "tests/planner/test_planner_up.py",
    "tests/planner/test_profile_mocker.py",
)


def _is_serial(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith(_SERIAL_PATHS):
        return True
    if _SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return any(any(item.iter_markers(name)) for name in ("multinode", "gang"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_serial(item):
            item.add_marker(pytest.mark.serial)
