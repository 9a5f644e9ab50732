"""Fixtures shared by the whole suite: real servers, started and reaped by the tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from dynamoctl.discovery.etcd_server import ManagedEtcd
from tests.infra.ports import free_port

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
# clusters (each kind is started in one process only) and what must not overlap: every
# vLLM test is in ``engines`` (never two vLLMs' memory at once). ``multinode`` has the
# multi-node Slurm cluster and the tests on it (mocker workers and Slurm jobs, which wait
# more than they compute), and a few wall-clock tests that need no cluster. ``hosts`` has
# the rest: the single-node Slurm, sshd hosts and gangs, and wall-clock tests (etcd
# freezes, planner load steps), whose deadlines leave room for the vLLM beside them.
# The multi-node Slurm tests were in ``engines``: in a 3-lane run (load 6-15) they took
# 499 s in their own lane, ``engines`` 709 s without them. Lanes build their namespaces,
# bridges, /etc/hosts names and Slurm clusters apart (tests/infra/netns.py, by pid).
_ENGINES = "engines"
_HOSTS = "hosts"
_MULTINODE_LANE = "multinode"
_SERIAL_FIXTURES = {
    "slurm": _HOSTS,
    "allocation": _HOSTS,
    "ssh_hosts2": _HOSTS,
    "slurm_multinode": _MULTINODE_LANE,
}
_SERIAL_PATHS = {
    "tests/slurm/": _HOSTS,
    "tests/launch/": _HOSTS,
    "tests/gpu/": _HOSTS,
    "tests/modelcache/test_shared_fs.py": _HOSTS,  # namespace hosts, a FUSE mount
    "tests/modelcache/test_tree.py": _HOSTS,  # sshd hosts with node-local mounts
    "tests/bench/": _HOSTS,
    "tests/security/test_locked_ssh.py": _HOSTS,
    "tests/engines/test_vllm_cpu.py": _ENGINES,
    "tests/engines/test_vllm_cpu_gang.py": _ENGINES,
    "tests/engines/test_vllm_cpu_cache.py": _ENGINES,
    "tests/engines/test_vllm_lmcache_cpu.py": _ENGINES,
    "tests/engines/test_vllm_nixl_cpu.py": _ENGINES,
    "tests/engines/test_vllm_nixl_multinode.py": _ENGINES,
    # No cluster of their own: in the shortest lane (~8 min against ~15 and ~16 for the
    # other two in a 3-lane run at load 6-15, before these three files moved; 259 s).
    "tests/frontend/test_openai_clients.py": _MULTINODE_LANE,  # vllm bench serve, no engine
    "tests/discovery/test_stale_serving.py": _MULTINODE_LANE,
    "tests/supervisor/test_discovery_outage.py": _MULTINODE_LANE,
    "tests/discovery/test_etcd_outage.py": _HOSTS,
    "tests/planner/test_planner_up.py": _HOSTS,
    "tests/planner/test_profile_mocker.py": _HOSTS,
}
_MULTINODE = "multinode"
"""Marker of the tests on a multi-node Slurm cluster (``slurm_multinode`` or their own)."""
_GANG = "gang"
"""Marker of the gang tests: local gangs of mocker (or argument-checking) processes."""


def _serial_lane(item: pytest.Item) -> str | None:
    """The serial lane ``item`` runs in, or None when it runs with the parallel part. A
    session cluster's lane comes first (it lives in one process only), then vLLM (a
    multi-node vLLM test too), then multi-node clusters, then the path, then gangs."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, lane in _SERIAL_FIXTURES.items():
        if fixture in fixtures:
            return lane
    path = item.nodeid.split("::", 1)[0]
    by_path = next(
        (lane for prefix, lane in _SERIAL_PATHS.items() if path.startswith(prefix)), None
    )
    if by_path == _ENGINES:
        return _ENGINES
    if any(item.iter_markers(_MULTINODE)):
        return _MULTINODE_LANE
    if by_path is not None:
        return by_path
    return _HOSTS if any(item.iter_markers(_GANG)) else None


# --- The order the parallel part starts its files in (``--no-loadscope-reorder``) ---------
# pytest-xdist hands out whole files, by default those with the most tests first: the
# slowest files, a vLLM start or minutes of wall clock in one or three tests, came last
# and left one worker running alone at the end. These go first, slowest first (seconds
# in the last CI run, on 2 loaded cores); the rest follow, most tests first as before.
_SLOW_FIRST = (
    "tests/frontend/test_real_clients.py",  # 131: guidellm sweeps, lm-eval
    "tests/engines/test_vllm_platform.py",  # 100: vLLM in three entry points
    "tests/supervisor/test_local_up.py",  # 99 in its four slowest
    "tests/engines/test_vllm_cpu_vision.py",  # 75: vLLM start
    "tests/engines/test_vllm_cpu_lora.py",  # 67: vLLM start
    "tests/planner/test_planner_both.py",  # 59
    "tests/engines/test_vllm_cpu_args.py",  # 60: vLLM's import (alone, load 5)
    "tests/engines/test_vllm_cpu_embed.py",  # 58: vLLM start
    "tests/supervisor/test_wedge.py",  # 57
    "tests/supervisor/test_adoption.py",  # 50
    "tests/supervisor/test_lora_up.py",  # 45
    "tests/supervisor/test_spares.py",  # 42
    "tests/supervisor/test_wedge_components.py",  # 37
    "tests/frontend/test_memory.py",  # 36
    "tests/supervisor/test_frontend_liveness.py",  # 34
    "tests/observability/test_traces.py",  # 30: Phoenix start
    "tests/recipe/test_kv_offload_engines.py",  # 29
)


def _parallel_order(items: list[pytest.Item], lanes: list[str | None]) -> list[pytest.Item]:
    """``items`` with the parallel part's files in the order they should start (listed
    slow files, then most tests first), each file's tests in their own order; the serial
    tests after them, in collection order."""
    rank = {path: i for i, path in enumerate(_SLOW_FIRST)}
    files = [item.nodeid.split("::", 1)[0] for item in items]
    count: dict[str, int] = {}
    for path, lane in zip(files, lanes, strict=True):
        if lane is None:
            count[path] = count.get(path, 0) + 1

    def key(i: int) -> tuple[int, int, int]:
        if lanes[i] is not None:
            return (len(rank) + 1, 0, i)
        return (rank.get(files[i], len(rank)), -count[files[i]], i)  # files stay whole

    return [items[i] for i in sorted(range(len(items)), key=key)]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lanes = [_serial_lane(item) for item in items]
    for item, lane in zip(items, lanes, strict=True):
        if lane is not None:
            item.add_marker(pytest.mark.serial)
            item.add_marker(pytest.mark.xdist_group(lane))
    items[:] = _parallel_order(items, lanes)
