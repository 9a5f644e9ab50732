"""Warm spares and start-up phases, end to end with ``dynamoctl up`` on the local target:
real supervisor, keepers, mocker workers, frontend and embedded discovery.

The mocker starts in about two seconds here (``engine-init-s: 20`` at ``speedup-ratio:
10``), so a cold start and a promotion are told apart by what happened, not by a timing
assertion: a promoted spare keeps its process (the same process group), its engine start
(the same start phases, one "on standby" line in its log), and goes READY.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import uuid
from typing import Any

import httpx
import msgspec
import psutil
import pytest

from dynamoctl.discovery import keys, store_from_url
from dynamoctl.wire.records import InstanceRecord
from tests.supervisor.conftest import (
    Cli,
    completions_until,
    free_port,
    live_in_group,
    mocker_recipe,
    states,
)

pytestmark = pytest.mark.fast_start

SPARE_RECIPE = "    spares: 1\n"


def spare_recipe(name: str, port: int) -> str:
    text = mocker_recipe(name, port, replicas=1)
    text = text.replace("speedup-ratio: 10}", "speedup-ratio: 10, engine-init-s: 20}")
    return text.replace("    gpus_per_replica: 0\n", "    gpus_per_replica: 0\n" + SPARE_RECIPE)


def row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in report["instances"] if r["name"] == name)


def records(cli: Cli, name: str, component: str) -> dict[str, InstanceRecord]:
    """Discovery records of ``component`` by supervisor label, read from the store."""
    state = json.loads((cli.home / "runs" / name / "state.json").read_text())
    plan = state["plan"]

    async def read() -> dict[str, InstanceRecord]:
        store = store_from_url(plan["discovery_url"])
        try:
            listing = await store.list(keys.instances_prefix(plan["namespace"], component))
        finally:
            await store.close()
        found = [msgspec.json.decode(v, type=InstanceRecord) for v in listing.items.values()]
        return {r.label: r for r in found}

    return asyncio.run(read())


def requests_served(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=5).text
    return sum(float(v) for v in re.findall(r"^dynamoctl_worker_requests_total\{.*\} (\S+)$",
                                             text, re.MULTILINE))  # fmt: skip


def load(port: int, most: int) -> tuple[list[str], list[int]]:
    """``most`` completions from three clients; their errors and successes."""
    stop, errors, done = threading.Event(), list[str](), list[int]()
    args = (f"http://127.0.0.1:{port}/v1", stop, errors, done, most)
    # Prompts apart: the router's prefix affinity would send the same one to one worker.
    kwargs = {"prompt": lambda: f"{uuid.uuid4()} " * 8}
    threads = [
        threading.Thread(target=completions_until, args=args, kwargs=kwargs) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    stop.set()
    return errors, done


def test_spare_is_promoted_on_scale_and_replaces_a_killed_replica(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(spare_recipe("spare", port))
    assert cli("up", str(recipe), "--detach").returncode == 0
    report = cli.wait_for(
        lambda r: states(r).get("agg-1") == "STANDBY", timeout=60, what="agg-1 on standby"
    )
    assert states(report) == {"agg-0": "READY", "agg-1": "STANDBY", "frontend-0": "READY"}
    spare = row(report, "agg-1")
    # Its start was timed, phase by phase: the engine's ~2 s are in the ready phase.
    start = spare["start"]
    assert start["process_s"] is not None and start["ready_s"] >= 1.5
    assert start["total_s"] >= start["ready_s"] and start["promotion_s"] is None
    assert report["measured_start_s"]["agg"] >= 1.5

    # The spare is out of routing: a standby record, no worker record, no request served.
    standby = records(cli, "spare", "standby")
    assert set(standby) == {"agg-1"} and "agg-1" not in records(cli, "spare", "worker")
    errors, done = load(port, 30)
    assert errors == [] and len(done) >= 30
    assert requests_served(standby["agg-1"].metrics_url or "") == 0

    # scale agg=2: the spare is promoted; same process, same start, no new engine start.
    scaled = cli("scale", "agg=2")
    assert scaled.returncode == 0, scaled.stderr
    report = cli.status()
    promoted = row(report, "agg-1")
    assert promoted["state"] == "READY" and promoted["pid"] == spare["pid"]
    assert promoted["restarts"] == 0
    assert promoted["start"]["total_s"] == start["total_s"]  # the spare's own start
    assert promoted["start"]["promotion_s"] is not None
    log = (cli.home / "runs" / "spare" / "logs" / "agg-1.log").read_text()
    assert log.count("instance(s) on standby") == 1 and "instance(s) ready" not in log
    assert "agg-1" in records(cli, "spare", "worker")
    # ... and it serves; the promoted spare is replaced in the background.
    errors, done = load(port, 60)
    assert errors == [] and requests_served(standby["agg-1"].metrics_url or "") > 0
    report = cli.wait_for(
        lambda r: states(r).get("agg-2") == "STANDBY", timeout=60, what="a new spare"
    )

    # kill -9 agg-0's worker: agg-2 takes its place at once; agg-0 comes back as the spare.
    spare2_pid = row(report, "agg-2")["pid"]
    worker = psutil.Process(row(report, "agg-0")["pid"]).children()[0]
    os.kill(worker.pid, signal.SIGKILL)
    report = cli.wait_for(
        lambda r: states(r).get("agg-2") == "READY" and states(r).get("agg-0") == "STANDBY",
        timeout=60,
        what="agg-2 promoted in agg-0's place, agg-0 back as the spare",
    )
    assert row(report, "agg-2")["pid"] == spare2_pid  # promoted, not started
    assert row(report, "agg-0")["restarts"] == 1
    assert set(records(cli, "spare", "worker")) == {"agg-1", "agg-2"}
    errors, done = load(port, 30)
    assert errors == []

    # scale down, then down: spares stay out of the count; down leaves nothing.
    assert cli("scale", "agg=1").returncode == 0
    report = cli.wait_for(
        lambda r: states(r).get("agg-2") == "STOPPED", timeout=60, what="agg-2 drained"
    )
    assert states(report)["agg-1"] == "READY" and states(report)["agg-0"] == "STANDBY"
    groups = [r["pid"] for r in report["instances"] if r["pid"]]
    assert cli("down").returncode == 0
    assert [g for g in groups if live_in_group(g)] == []
    assert records(cli, "spare", "standby") == {} == records(cli, "spare", "worker")
