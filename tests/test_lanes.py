"""The serial part's lanes (tests/conftest.py) hold under pytest-xdist as CI runs it: each
serial test reaches its worker named by its lane (``nodeid@lane``), so pytest-xdist's
``loadgroup`` keeps a lane on one worker. With pytest 9.2 and pytest-xdist 3.8 no test had
a lane (xdist renames ``item._nodeid``, which pytest 9.2 no longer reads) and the vLLM
tests ran on both serial workers at once: pyproject.toml pins pytest below 9.2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import SERIAL_LANES

REPO = Path(__file__).resolve().parents[1]

# A plugin that records each test's node id as its xdist worker sees it, and runs nothing.
PROBE = """
import os, pytest
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open(os.environ["LANE_PROBE_OUT"], "a") as out:
        out.write(item.nodeid + "\\n")
    pytest.skip("lane probe")
"""


def test_every_serial_test_reaches_its_worker_in_its_lane(tmp_path: Path) -> None:
    (tmp_path / "lane_probe.py").write_text(PROBE)
    seen = tmp_path / "seen.txt"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}", "LANE_PROBE_OUT": str(seen)}
    files = [
        "tests/slurm/test_multinode_cluster.py",  # multinode: the multi-node Slurm cluster
        "tests/discovery/test_etcd_outage.py",  # hosts: etcd freezes against lease TTLs
        "tests/frontend/test_fair_share.py",  # not serial (absent: parallel part)
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "lane_probe", "-p", "no:cacheprovider",
         "-n", "1", "--dist", "loadgroup", "-m", "serial", "-q", *files],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ids = seen.read_text().split()
    lanes = {nodeid.split("::")[0]: nodeid.rsplit("@", 1)[-1] for nodeid in ids}
    assert lanes == {
        "tests/slurm/test_multinode_cluster.py": "multinode",
        "tests/discovery/test_etcd_outage.py": "hosts",
    }, ids
    assert all(re.search(r"@(engines|hosts|multinode)$", nodeid) for nodeid in ids), ids


def test_the_makefile_starts_a_worker_per_lane() -> None:
    makefile = (REPO / "Makefile").read_text()
    declared = re.search(r"^SERIAL_LANES := (\d+)$", makefile, re.M)
    assert declared is not None
    assert int(declared.group(1)) == len(SERIAL_LANES)
