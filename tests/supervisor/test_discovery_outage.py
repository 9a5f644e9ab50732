"""A supervised deployment through an etcd freeze: real etcd, real ``dynamoctl up`` with
mocker workers, real signals (docs/discovery.md, "Outages"; docs/operations.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import psutil
import pytest
from rich.console import Console

from dynamoctl.cli.view import status_table
from dynamoctl.discovery.etcd import EtcdStore
from dynamoctl.discovery.etcd_server import ManagedEtcd
from dynamoctl.wire.control import DiscoveryStatus, InstanceStatus, StatusReport
from dynamoctl.wire.states import Phase, State
from tests.supervisor.conftest import Cli, free_port, mocker_recipe, states

FREEZE = 30.0
"""The freeze the issue names: three lease TTLs of the recipe below, and then some."""


@pytest.fixture
def etcd() -> Iterator[ManagedEtcd]:
    with ManagedEtcd(client_port=free_port(), peer_port=free_port()) as server:
        yield server


def _load(url: str, stop: threading.Event, codes: Counter[int], errors: list[str]) -> None:
    body = {"model": "mock-llama", "prompt": "hello " * 20, "max_tokens": 8}
    with httpx.Client(timeout=30, trust_env=False) as http:
        while not stop.is_set():
            try:
                reply = http.post(f"{url}/completions", json=body)
                codes[reply.status_code] += 1
                if reply.status_code != 200:
                    errors.append(reply.text[:300])
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
            time.sleep(0.05)


async def _get(endpoint: str, key: str) -> bytes | None:
    store = EtcdStore([endpoint])
    try:
        return await store.get(key)
    finally:
        await store.close()


def test_supervision_survives_a_30s_etcd_freeze_and_restarts_a_worker_killed_after(
    cli: Cli, etcd: ManagedEtcd
) -> None:
    """SIGSTOP etcd for 30 s under load, SIGCONT, then kill the workers: status says
    discovery is unreachable during the freeze while every instance stays READY (none is
    killed as hung for being unregistered), clients get no 404, and each killed worker is
    restarted (before the fix, supervision tasks died with the freeze)."""
    port = free_port()
    discovery = f"discovery: {{backend: etcd, endpoints: ['{etcd.endpoint}'], lease_ttl: 3}}\n"
    recipe = cli.recipe(mocker_recipe("frozen", port, replicas=2, extra=discovery))
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    pids = {row["name"]: row["pid"] for row in cli.status()["instances"]}

    stop, codes, errors = threading.Event(), Counter[int](), list[str]()
    url = f"http://127.0.0.1:{port}/v1"
    load = [threading.Thread(target=_load, args=(url, stop, codes, errors)) for _ in range(2)]
    for thread in load:
        thread.start()
    assert etcd.pid is not None
    try:
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            report = cli.wait_for(
                lambda r: not r["discovery"]["reachable"], timeout=20, what="unreachable"
            )
            assert report["discovery"]["location"] == etcd.endpoint
            shown = cli("status")
            words = " ".join(shown.stdout.split())  # rich wraps at the terminal's width
            assert f"discovery at {etcd.endpoint} unreachable for" in words, shown.stdout
            time.sleep(max(0.0, FREEZE - 10))
            during = cli.status()
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        assert not during["discovery"]["reachable"]
        assert during["discovery"]["unreachable_s"] > FREEZE / 2
        assert set(states(during).values()) == {"READY"}, during
        assert all(row["restarts"] == 0 for row in during["instances"]), during

        cli.wait_for(lambda r: r["discovery"]["reachable"], timeout=30, what="reachable")
        time.sleep(5)  # every lease expired on resume; all re-registered meanwhile
        settled = cli.status()
        assert set(states(settled).values()) == {"READY"}, settled
        assert {row["name"]: row["pid"] for row in settled["instances"]} == pids
        # The supervisor's own registration outlived the freeze too (its lease expired).
        control = "frozen/instances/supervisor/control/frozen"
        assert asyncio.run(_get(etcd.endpoint, control)) is not None
    finally:
        stop.set()
        for thread in load:
            thread.join(60)
    # Through the freeze and the mass expiry after it, every request was served.
    print(f"requests through the freeze and the expiry: {dict(codes)}")
    assert codes[200] > 100 and set(codes) == {200}, (codes, errors)
    try:
        # Every worker's supervision must have survived: kill them all, each comes back.
        for name in ("agg-0", "agg-1"):
            psutil.Process(pids[name]).children()[0].kill()
        report = cli.wait_for(
            lambda r: all(
                x["restarts"] == 1 and x["state"] == "READY"
                for x in r["instances"]
                if x["name"] in ("agg-0", "agg-1")
            ),
            timeout=60,
            what="both workers restarted after the freeze",
        )
        for row in report["instances"]:
            assert row["pid"] is not None and (row["pid"] == pids[row["name"]]) == (
                row["name"] == "frontend-0"
            ), row
        assert report["discovery"]["reachable"]
        # READY is the supervisor's view (the records are in etcd); the frontend's own
        # watch may deliver them a moment later, and until then it answers 503 with no
        # worker (both were restarted at once): a client retries, so does this one.
        with httpx.Client(timeout=30, trust_env=False) as http:
            body = {"model": "mock-llama", "prompt": "again", "max_tokens": 2}
            answers = [http.post(f"{url}/completions", json=body).status_code]
            deadline = time.monotonic() + 10
            while answers[-1] == 503 and time.monotonic() < deadline:
                time.sleep(0.2)
                answers.append(http.post(f"{url}/completions", json=body).status_code)
            assert answers[-1] == 200, answers
    finally:
        assert cli("down").returncode == 0


def test_a_worker_killed_during_a_freeze_is_restarted_and_ready_once_etcd_is_back(
    cli: Cli, etcd: ManagedEtcd
) -> None:
    """A worker that dies while etcd is frozen (past the lease TTL) is restarted at once;
    its new process cannot register until etcd is back, then becomes READY. The other one
    stays READY throughout."""
    discovery = f"discovery: {{backend: etcd, endpoints: ['{etcd.endpoint}'], lease_ttl: 3}}\n"
    recipe = cli.recipe(mocker_recipe("killed", free_port(), replicas=2, extra=discovery))
    assert cli("up", str(recipe), "--detach").returncode == 0
    pids = {row["name"]: row["pid"] for row in cli.status()["instances"]}
    assert etcd.pid is not None
    try:
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            cli.wait_for(lambda r: not r["discovery"]["reachable"], timeout=20, what="down")
            psutil.Process(pids["agg-1"]).children()[0].kill()
            during = cli.wait_for(
                lambda r: any(x["name"] == "agg-1" and x["restarts"] == 1 for x in r["instances"]),
                timeout=20,
                what="agg-1 restarted during the freeze",
            )
            assert states(during)["agg-0"] == "READY"
            time.sleep(6)  # past the lease TTL: every lease expires on resume
            during = cli.status()
            assert states(during)["agg-1"] == "STARTING", during  # cannot register yet
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        report = cli.wait_for(
            lambda r: set(states(r).values()) == {"READY"} and r["discovery"]["reachable"],
            timeout=60,
            what="agg-1 READY once etcd is back",
        )
        restarts = {row["name"]: row["restarts"] for row in report["instances"]}
        assert restarts == {"agg-0": 0, "agg-1": 1, "frontend-0": 0}, report
    finally:
        assert cli("down").returncode == 0


def test_status_table_says_when_discovery_is_unreachable() -> None:
    row = InstanceStatus(
        name="agg-0", pool="agg", component="worker", host="h", pid=7,
        state=State.READY, restarts=0, uptime_s=5.0,
    )  # fmt: skip
    down = DiscoveryStatus(
        reachable=False, location="http://10.0.0.1:2379", unreachable_s=42.0, error="timeout"
    )
    report = StatusReport(
        name="d", phase=Phase.SERVING, endpoint="e", model="m", target="local",
        instances=[row], discovery=down,
    )  # fmt: skip
    console = Console(width=100, record=True)
    console.print(status_table(report, 100))
    text = console.export_text()
    assert "discovery unreachable" in text
    assert "discovery at http://10.0.0.1:2379 unreachable for 42 s (timeout)" in text
    report.discovery = DiscoveryStatus()
    console = Console(width=100, record=True)
    console.print(status_table(report, 100))
    assert "unreachable" not in console.export_text()
