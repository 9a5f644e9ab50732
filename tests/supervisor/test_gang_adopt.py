"""A restarted supervisor takes back running gangs whole (docs/operations.md, "Restarting
the supervisor"): SIGKILL the supervisor of two local mocker gangs under load, ``up``
again, and each gang (leader and follower) is adopted with its processes, not restarted
and not orphaned; a gang that lost a member while no supervisor watched is reaped and
started afresh as a whole. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import psutil
import pytest

from tests.supervisor.conftest import Cli, completions_until, free_port, live_in_group, states
from tests.supervisor.test_gang_up import gang_recipe

pytestmark = pytest.mark.gang

MEMBERS = ("agg-0", "agg-0.1", "agg-1", "agg-1.1")


def _pids(report: dict[str, Any]) -> dict[str, int]:
    return {row["name"]: row["pid"] for row in report["instances"]}


def _kill_supervisor(cli: Cli, name: str) -> None:
    pid = json.loads((cli.home / "runs" / name / "state.json").read_text())["supervisor_pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the supervisor did not die"
        time.sleep(0.05)


def test_a_restarted_supervisor_adopts_gangs_whole(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(gang_recipe("gadopt", port) + "  orphan_grace: 60\n")
    assert cli("up", str(recipe), "--detach", timeout=120).returncode == 0
    pids = _pids(cli.status())

    stop, errors, done = threading.Event(), list[str](), list[int]()
    url = f"http://127.0.0.1:{port}/v1"
    load = [
        threading.Thread(target=completions_until, args=(url, stop, errors, done, 2000, 60.0))
        for _ in range(3)
    ]
    for thread in load:
        thread.start()
    try:
        time.sleep(1.0)
        _kill_supervisor(cli, "gadopt")
        served = len(done)
        time.sleep(1.5)
        assert len(done) > served  # the gangs serve without a supervisor
        assert all(live_in_group(pids[n]) for n in MEMBERS)  # nothing stopped
        began = time.monotonic()
        again = cli("up", str(recipe), "--detach", timeout=120)
        adopt_s = time.monotonic() - began
        assert again.returncode == 0, again.stdout + again.stderr
        served = len(done)
        time.sleep(1.5)
        assert len(done) > served  # and keep serving after the adoption
    finally:
        stop.set()
        for thread in load:
            thread.join(120)
    assert errors == []
    report = cli.status()
    assert states(report) == {n: "READY" for n in (*MEMBERS, "frontend-0")}
    assert _pids(report) == pids  # the same processes, followers included
    assert all(row["restarts"] == 0 for row in report["instances"])
    log = (cli.home / "runs" / "gadopt" / "supervisor.log").read_text()
    assert "took back agg-0, agg-0.1, agg-1, agg-1.1, frontend-0" in log
    print(f"\ngang adoption: up after SIGKILL {adopt_s:.2f} s; {len(done)} requests, 0 failed")

    # The adopted follower is watched: killing it restarts its gang once.
    psutil.Process(pids["agg-0.1"]).children()[0].kill()
    report = cli.wait_for(
        lambda r: (
            next(x for x in r["instances"] if x["name"] == "agg-0")["restarts"] == 1
            and {x["state"] for x in r["instances"]} == {"READY"}
        ),
        timeout=90,
        what="the adopted gang agg-0 restarted",
    )
    assert live_in_group(pids["agg-0"]) == []  # the adopted leader went with its follower

    # A member lost while no supervisor watched: its gang is not half-adopted.
    pids = _pids(report)
    _kill_supervisor(cli, "gadopt")
    lost = psutil.Process(pids["agg-1.1"])
    lost.children()[0].kill()
    lost.wait(30)  # its keeper ends with it
    again = cli("up", str(recipe), "--detach", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    report = cli.status()
    assert {x["state"] for x in report["instances"]} == {"READY"}
    now = _pids(report)
    assert (now["agg-0"], now["agg-0.1"]) == (pids["agg-0"], pids["agg-0.1"])  # adopted
    assert now["agg-1"] != pids["agg-1"] and live_in_group(pids["agg-1"]) == []  # reaped
    log = (cli.home / "runs" / "gadopt" / "supervisor.log").read_text()
    assert "agg-1 (pid" in log and "gang agg-1 lost agg-1.1" in log
    client_errors: list[str] = []
    completions_until(url, threading.Event(), client_errors, [], most=8)
    assert client_errors == []
    assert cli("down").returncode == 0
    for pgid in now.values():
        assert live_in_group(pgid) == [], pgid
