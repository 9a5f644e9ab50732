"""Fixtures shared by the whole suite: real servers, started and reaped by the tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest

from dynamoctl.discovery.etcd_server import ManagedEtcd
from tests.infra.ports import free_port

# Bytecode caches are written, whatever the shell says: machines of this kind set
# PYTHONDONTWRITEBYTECODE=1 and uv installs without bytecode, so every process the suite
# starts (supervisors, frontends, workers, CLI calls, vLLM engines: thousands) compiled each
# module it imported from source, every time (torch and vLLM alone: ~15 s a start). Set
# before pytest-xdist starts its workers, so that they and every process they start inherit
# it; tests/test_bytecode.py checks.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The Slurm clusters: one of each kind for the whole session, whichever directory asks.
pytest_plugins = ["tests.infra.fixtures"]


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[ManagedEtcd]:
    """A real etcd 3.x server on 127.0.0.1, shared by the session (tests use own prefixes)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: apt-get install etcd-server (.ci/run does this)")
    # Started with room for a loaded machine (etcd's own default waits 15 s).
    with ManagedEtcd(client_port=free_port(), peer_port=free_port()).start(timeout=60) as server:
        yield server


# --- Which tests run apart (marker `serial`; `make test` runs them after the parallel part) --
# The rest run on several pytest-xdist workers at once (whole files per worker). A test is
# serial when it shares a session cluster (one per process: Slurm, sshd hosts), builds
# network namespaces or /etc/hosts names, starts vLLM (all cores, GiBs of memory), or
# asserts on wall-clock behaviour under a load it creates itself (etcd freezes against
# lease TTLs, planner load steps, throughput against a timing model).
#
# Serial tests run in three lanes, one pytest-xdist worker each (``--dist loadgroup``):
# within a lane one test at a time, the lanes side by side. A lane owns its session
# clusters (each kind is started in one process only) and what must not overlap:
# - ``engines``: every vLLM test (never two vLLMs' memory and cores at once);
# - ``multinode``: the multi-node Slurm cluster and the tests on it (mocker workers), and
#   for balance two files that share nothing: ``vllm bench serve`` against mocker
#   deployments and the supervisor under etcd outages;
# - ``hosts``: the single-node Slurm, sshd hosts and gangs, and the wall-clock tests (etcd
#   freezes, planner load steps, ``vllm bench serve``), which wait more than they compute;
#   their deadlines leave room for the vLLM beside them.
# In two lanes (multinode with engines, 2026-11-29, ``--durations=0``) the engines lane
# held ~1000 s of tests against ~660 s in hosts and set the serial part's wall time; in
# three, before those two files moved: hosts 798 s, engines 632 s, multinode 355 s.
_ENGINES = "engines"
_HOSTS = "hosts"
_MULTINODE_LANE = "multinode"
SERIAL_LANES = (_ENGINES, _HOSTS, _MULTINODE_LANE)
"""The lanes; the Makefile starts one worker for each (tests/test_lanes.py checks both)."""
_SERIAL_FIXTURES = {
    "slurm": _HOSTS,
    "allocation": _HOSTS,
    "ssh_hosts2": _HOSTS,
    "slurm_multinode": _MULTINODE_LANE,
}
_VLLM_PATHS = (
    "tests/engines/test_vllm_cpu.py",
    "tests/engines/test_vllm_cpu_gang.py",
    "tests/engines/test_vllm_cpu_cache.py",
    "tests/engines/test_vllm_lmcache_cpu.py",
    "tests/engines/test_vllm_nixl_cpu.py",
    "tests/engines/test_vllm_nixl_multinode.py",  # its own sshd hosts, not the Slurm cluster
)
_SERIAL_PATHS = {
    "tests/slurm/": _HOSTS,
    "tests/launch/": _HOSTS,
    "tests/gpu/": _HOSTS,
    "tests/modelcache/test_shared_fs.py": _HOSTS,  # namespace hosts, a FUSE mount
    "tests/modelcache/test_tree.py": _HOSTS,  # sshd hosts with node-local mounts
    "tests/bench/": _HOSTS,
    "tests/security/test_locked_ssh.py": _HOSTS,
    "tests/frontend/test_openai_clients.py": _MULTINODE_LANE,  # vllm bench serve, no engine
    "tests/discovery/test_etcd_outage.py": _HOSTS,
    "tests/discovery/test_stale_serving.py": _HOSTS,
    "tests/supervisor/test_discovery_outage.py": _MULTINODE_LANE,
    "tests/planner/test_planner_up.py": _HOSTS,
    "tests/planner/test_profile_mocker.py": _HOSTS,
}
_MULTINODE = "multinode"
"""Marker of the tests on a multi-node Slurm cluster (``slurm_multinode`` or their own)."""
_GANG = "gang"
"""Marker of the gang tests: local gangs of mocker (or argument-checking) processes."""


def _serial_lane(item: pytest.Item) -> str | None:
    """The serial lane ``item`` runs in, or None when it runs with the parallel part. A
    session cluster's lane comes first (it lives in one process only), then vLLM, then
    multi-node clusters, then the path, then gangs."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, lane in _SERIAL_FIXTURES.items():
        if fixture in fixtures:
            return lane
    path = item.nodeid.split("::", 1)[0]
    if path in _VLLM_PATHS:
        return _ENGINES
    if any(item.iter_markers(_MULTINODE)):
        return _MULTINODE_LANE
    for prefix, lane in _SERIAL_PATHS.items():
        if path.startswith(prefix):
            return lane
    return _HOSTS if any(item.iter_markers(_GANG)) else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = _serial_lane(item)
        if lane is not None:
            item.add_marker(pytest.mark.serial)
            item.add_marker(pytest.mark.xdist_group(lane))
