"""``frontend.processes: 2`` on the local target, end to end: two supervised frontend
processes on one port, both serving, each probed through a port of its own; one killed is
restarted while the other keeps serving. Their routers' shared bookings:
tests/frontend/test_shared_bookings.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from urllib.parse import urlsplit

import httpx
import msgspec
import psutil

from dynamoctl.discovery import keys, store_from_url
from dynamoctl.wire.records import InstanceRecord
from tests.supervisor.conftest import Cli, completions_until, free_port, mocker_recipe, states

BODY = {"model": "mock-llama", "prompt": "hello " * 30, "max_tokens": 4, "ignore_eos": True}


def _connections_to(pid: int, port: int) -> int:
    """Established connections on ``port`` held in the process group led by ``pid`` (an
    instance: its keeper and the frontend process)."""
    leader = psutil.Process(pid)
    conns = [c for p in [leader, *leader.children(recursive=True)] for c in p.net_connections()]
    return sum(1 for c in conns if c.status == "ESTABLISHED" and c.laddr.port == port)


def _own_ports(cli: Cli, name: str) -> dict[str, list[int]]:
    """The own ports of each frontend by label, from their discovery records
    (``health_url``): a killed process's record lingers beside its successor's."""
    plan = json.loads((cli.home / "runs" / name / "state.json").read_text())["plan"]

    async def records() -> list[InstanceRecord]:
        store = store_from_url(plan["discovery_url"])
        try:
            listing = await store.list(keys.instances_prefix(plan["namespace"], "frontend"))
            return [msgspec.json.decode(v, type=InstanceRecord) for v in listing.items.values()]
        finally:
            await store.close()

    ports: dict[str, list[int]] = {}
    for record in asyncio.run(records()):
        ports.setdefault(record.label, []).append(urlsplit(record.health_url or "").port or 0)
    return ports


def _serves(port: int) -> bool:
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=30)
    return answer.status_code == 200


def test_two_frontend_processes_serve_one_port(cli: Cli) -> None:
    port = free_port()
    text = mocker_recipe("fan", port, replicas=2).replace(
        f"frontend: {{port: {port}}}", f"frontend: {{port: {port}, processes: 2}}"
    )
    up = cli("up", str(cli.recipe(text)), "--detach")
    assert up.returncode == 0, up.stderr
    try:
        report = cli.status()
        assert states(report) == {
            "agg-0": "READY", "agg-1": "READY", "frontend-0": "READY", "frontend-1": "READY",
        }  # fmt: skip
        pids = {row["name"]: row["pid"] for row in report["instances"]}
        base = f"http://127.0.0.1:{port}"

        # Each is READY for itself, not because a sibling answered its probe on the
        # shared port: its own port (where the supervisor probes it) serves at once.
        own = _own_ports(cli, "fan")
        assert sorted(own) == ["frontend-0", "frontend-1"], own
        (first,), (second,) = own["frontend-0"], own["frontend-1"]
        assert len({first, second, port, 0}) == 4, own
        assert _serves(first) and _serves(second)

        # Both serve: 16 kept-alive connections, one request each, spread by the kernel
        # (all on one process: 1 chance in 2^15).
        clients = [httpx.Client(base_url=base, timeout=30) for _ in range(16)]
        try:
            for client in clients:
                assert client.post("/v1/completions", json=BODY).status_code == 200
            held = {n: _connections_to(pids[n], port) for n in ("frontend-0", "frontend-1")}
            assert all(held.values()) and sum(held.values()) >= 16, held  # + probes
        finally:
            for client in clients:
                client.close()

        # kill -9 frontend-1: frontend-0 keeps serving new connections; frontend-1 restarts.
        frontend = psutil.Process(pids["frontend-1"])
        victim = ([frontend, *frontend.children(recursive=True)])[-1]  # the frontend itself
        os.kill(victim.pid, signal.SIGKILL)
        stop, errors, done = threading.Event(), [], []
        load = threading.Thread(
            target=completions_until, args=(f"{base}/v1", stop, errors, done), kwargs={"most": 20}
        )
        time.sleep(0.2)  # its listener is gone: new connections go to frontend-0
        load.start()
        load.join(60)
        assert errors == [] and len(done) == 20
        report = cli.wait_for(
            lambda r: any(
                x["name"] == "frontend-1" and x["restarts"] == 1 and x["state"] == "READY"
                for x in r["instances"]
            ),
            timeout=90,
            what="frontend-1 restarted",
        )
        assert states(report)["frontend-0"] == "READY"
        row = next(r for r in report["instances"] if r["name"] == "frontend-0")
        assert row["restarts"] == 0 and row["pid"] == pids["frontend-0"]
        # READY means the new process serves (the killed one's record may linger).
        assert any(_serves(p) for p in _own_ports(cli, "fan")["frontend-1"])
    finally:
        cli("down", "fan")
