"""A component that exits while STARTING is seen at once: FAILED with its exit status and
its last log line, then ``up`` rolls back (still starting) or the restart policy runs
(serving). Its port taken by a real socket is what makes it exit here: what a CI run hit
when a worker's own ephemeral bind took the frontend's port between ``up``'s preflight and
the frontend's start (the supervisor then never saw the frontend exit, and hung)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tests.supervisor.conftest import REPO, Cli, free_port, mocker_recipe, states


def listening(port: int) -> socket.socket:
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("127.0.0.1", port))
    busy.listen()
    return busy


def wait_for_record(state: Path, name: str, timeout: float = 60.0) -> None:
    """Until ``state.json`` records ``name``'s process (launched: preflight is over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if name in (json.loads(state.read_text()).get("records") or {}):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"{name} not launched within {timeout} s")


def test_frontend_port_taken_after_preflight_fails_up_fast(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(mocker_recipe("taken", port, replicas=1))
    up = subprocess.Popen(
        [sys.executable, "-m", "dynamoctl", "up", str(recipe), "--detach"],
        cwd=REPO, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # agg-0 launched: preflight found the port free; the frontend starts once agg-0
        # is READY, seconds later, and finds it taken.
        wait_for_record(cli.home / "runs" / "taken" / "state.json", "agg-0")
        with listening(port):
            _, err = up.communicate(timeout=60)
    finally:
        up.kill()
    assert up.returncode == 1, err
    assert "frontend-0 (frontend on localhost) failed to start: exited with status 1" in err
    assert f":{port}: Address already in use" in err  # the instance and the port, named
    assert "rolled back" in err
    down = cli("down", "taken", "--now", timeout=30)
    assert down.returncode == 0, down.stderr


def test_frontend_exiting_while_starting_again_is_failed_then_restarted(cli: Cli) -> None:
    """Serving: frontend-0 killed, its port taken before it starts again. Each restart
    exits while STARTING: FAILED with the port in its message, then BACKOFF and another
    start, until the port is free and it is READY."""
    port = free_port()
    recipe = cli.recipe(mocker_recipe("again", port, replicas=1))
    assert cli("up", str(recipe), "--detach").returncode == 0
    frontend = next(r for r in cli.status()["instances"] if r["name"] == "frontend-0")
    child = psutil.Process(frontend["pid"]).children()[0]
    busy = None
    try:
        child.kill()
        child.wait(10)
        busy = listening(port)  # free since its holder died; taken before the restart
        report = cli.wait_for(
            lambda r: "Address already in use" in _row(r)["message"],
            timeout=60,
            what="frontend-0's restart failing on its port",
        )
        row = _row(report)
        assert f":{port}: Address already in use" in row["message"]
        assert row["message"].startswith("exited with status 1: ")
    finally:
        if busy is not None:
            busy.close()
    cli.wait_for(
        lambda r: states(r)["frontend-0"] == "READY" and _row(r)["restarts"] >= 2,
        timeout=90,
        what="frontend-0 READY again once its port is free",
    )
    assert cli("down", "--now", timeout=60).returncode == 0


def _row(report: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in report["instances"] if r["name"] == "frontend-0")
