"""Multi-node replicas served by ``dynamoctl up`` on the local target: two mocker gangs
of two members each (a leader and a ``dynamoctl follower``, on localhost with distinct
ranks), real processes and signals. A killed follower restarts its whole gang once
while the other gang takes the requests; ``scale`` removes and adds whole gangs; the
dry run shows every rank. Start-to-ready and restart times are printed (figures for
docs, never asserted)."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import psutil
import pytest

from dynamoctl.engines.spec import POOL_BLOCK
from tests.infra.ports import free_port_base
from tests.supervisor.conftest import (
    Cli,
    completions_until,
    free_port,
    live_in_group,
    mocker_recipe,
    states,
)

pytestmark = pytest.mark.gang


def gang_rendezvous(replicas: int) -> int:
    """A ``workers.rendezvous_port`` whose one-host gangs' ports are free now, so that
    gang tests running side by side (CI's serial lanes) never share one."""
    return free_port_base([POOL_BLOCK["agg"] + index for index in range(replicas)])


def gang_recipe(name: str, port: int, replicas: int = 2, rendezvous: int | None = None) -> str:
    """:func:`mocker_recipe`'s deployment with each replica a gang of two members, which
    answer every simulated step within the collective timeout."""
    text = mocker_recipe(name, port, replicas)
    first = gang_rendezvous(replicas) if rendezvous is None else rendezvous
    for old, new in (
        ("workers:\n", f"workers:\n  rendezvous_port: {first}\n"),
        ("    gpus_per_replica: 0\n", "    nodes_per_replica: 2\n    gpus_per_replica: 0\n"),
        ("speedup-ratio: 10}", "speedup-ratio: 10, collective-timeout: 60}"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return text


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in report["instances"] if r["name"] == name)


def _ready_after(log: str, name: str) -> list[float]:
    """Seconds from launch to READY of each start of ``name``, from the supervisor log."""
    pattern = rf"{re.escape(name)} on \S+: STARTING -> READY \(ready after ([\d.]+) s\)"
    return [float(x) for x in re.findall(pattern, log)]


def test_a_killed_follower_restarts_its_gang_once_and_no_request_fails(cli: Cli) -> None:
    port, rendezvous = free_port(), gang_rendezvous(2)
    recipe = cli.recipe(gang_recipe("gang", port, rendezvous=rendezvous))
    dry = cli("up", str(recipe), "--dry-run")
    assert "[agg-0.1] follower on localhost, gpus -, gang agg-0 rank 1/2" in dry.stdout
    follower_cmd = dry.stdout.split("[agg-0.1]")[1].split("[agg-1]")[0]
    assert "dynamoctl follower --engine mocker --label agg-0.1" in follower_cmd
    assert (
        f"--master-port {rendezvous + POOL_BLOCK['agg']}" in follower_cmd
        and "--nnodes 2 --node-rank 1" in follower_cmd
    )

    began = time.monotonic()
    up = cli("up", str(recipe), "--detach", timeout=120)
    up_s = time.monotonic() - began
    assert up.returncode == 0, up.stderr
    report = cli.status()
    assert states(report) == {
        "agg-0": "READY",
        "agg-0.1": "READY",
        "agg-1": "READY",
        "agg-1.1": "READY",
        "frontend-0": "READY",
    }
    assert (_row(report, "agg-0.1")["gang"], _row(report, "agg-0.1")["rank"]) == ("agg-0", 1)
    table = cli("status").stdout
    print(table)
    assert "└ agg-0.1" in table

    stop, errors, done = threading.Event(), [], []
    url = f"http://127.0.0.1:{port}/v1"
    load_args = (url, stop, errors, done, 2000, 60.0)
    load = [threading.Thread(target=completions_until, args=load_args) for _ in range(4)]
    for thread in load:
        thread.start()
    try:
        time.sleep(1.0)
        served_before = len(done)
        follower_keeper = psutil.Process(_row(report, "agg-0.1")["pid"])
        leader_pgid = _row(report, "agg-0")["pid"]
        killed_at = time.monotonic()
        follower_keeper.children()[0].kill()  # the follower process itself: SIGKILL
        report = cli.wait_for(
            lambda r: (
                _row(r, "agg-0")["restarts"] == 1
                and all(_row(r, n)["state"] == "READY" for n in ("agg-0", "agg-0.1"))
            ),
            timeout=90,
            what="the gang agg-0 restarted",
        )
        restart_s = time.monotonic() - killed_at
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in load:
            thread.join(120)
    assert errors == []
    assert len(done) > served_before > 0
    leader = _row(report, "agg-0")
    assert "gang member agg-0.1 on localhost exited with status" in leader["message"]
    assert leader["pid"] != leader_pgid and live_in_group(leader_pgid) == []
    assert _row(report, "agg-1")["restarts"] == 0  # the other gang was untouched
    log = (cli.home / "runs" / "gang" / "supervisor.log").read_text()
    starts = _ready_after(log, "agg-0")
    print(
        f"\ngang figures: up --detach {up_s:.2f} s; gang agg-0 launch->READY {starts[0]:.2f} s; "
        f"follower SIGKILL -> gang READY again {restart_s:.2f} s (relaunch->READY "
        f"{starts[-1]:.2f} s); {len(done)} requests, {len(errors)} failed"
    )

    # scale removes and adds whole gangs; drained gangs free their nodes.
    assert cli("scale", "agg=1", timeout=120).returncode == 0
    report = cli.wait_for(
        lambda r: {_row(r, n)["state"] for n in ("agg-1", "agg-1.1")} == {"STOPPED"},
        what="gang agg-1 scaled away",
    )
    assert cli("scale", "agg=2", timeout=120).returncode == 0
    report = cli.wait_for(
        lambda r: {_row(r, n)["state"] for n in ("agg-1", "agg-1.1")} == {"READY"},
        timeout=60,
        what="gang agg-1 back",
    )
    # drain a follower's name: its gang drains, the leader first, then its followers.
    assert cli("drain", "agg-1.1").returncode == 0
    report = cli.wait_for(
        lambda r: {_row(r, n)["state"] for n in ("agg-1", "agg-1.1")} == {"STOPPED"},
        what="gang agg-1 drained",
    )
    assert _row(report, "agg-1")["restarts"] == 0  # on purpose: no budget spent
    log = (cli.home / "runs" / "gang" / "supervisor.log").read_text()
    drained = log.rindex("agg-1 on localhost: READY -> DRAINING")
    assert log.index("agg-1 ended (status 0): stopping its followers agg-1.1", drained) > drained
    pgids = [row["pid"] for row in report["instances"] if row["pid"]]
    assert cli("down").returncode == 0
    for pgid in pgids:
        assert live_in_group(pgid) == [], pgid


def test_a_stopped_follower_stalls_its_leader_and_the_gang_is_restarted_as_hung(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(gang_recipe("stall", port, replicas=2))
    assert cli("up", str(recipe), "--detach", timeout=120).returncode == 0
    report = cli.status()
    follower = psutil.Process(_row(report, "agg-0.1")["pid"]).children()[0]
    stop, errors, done = threading.Event(), [], []
    url = f"http://127.0.0.1:{port}/v1"
    load_args = (url, stop, errors, done, 2000, 60.0)
    load = [threading.Thread(target=completions_until, args=load_args) for _ in range(4)]
    for thread in load:
        thread.start()
    try:
        time.sleep(1.0)
        follower.suspend()  # as a GPU hung in a collective: the leader's steps stall
        report = cli.wait_for(
            lambda r: _row(r, "agg-0")["restarts"] == 1 and _row(r, "agg-0")["state"] == "READY",
            timeout=90,
            what="the stalled gang restarted",
        )
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in load:
            thread.join(120)
        if follower.is_running():
            follower.kill()
    assert errors == []
    # Two judgements see a stalled gang, whichever is first on a loaded machine: tokens
    # stopped with requests in flight (hang_timeout 4 s), or the leader's collective
    # waiting on a member past wedge_timeout (6 s). Either restarts the gang whole.
    message = _row(report, "agg-0")["message"]
    assert "hung: no token generated" in message or "wedged: its gang's step stalled" in message
    assert _row(report, "agg-0.1")["state"] == "READY"
    assert cli("down", "--now").returncode == 0
