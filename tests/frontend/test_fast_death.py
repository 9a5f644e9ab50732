"""A SIGKILLed worker, seen by the frontend's request plane (docs/planes.md, "Dead
peers"): its in-flight stream migrates at once, and no new request goes to it while its
discovery record lives on. Every process here has a 5-minute lease, so discovery cannot
be what excludes the dead worker; the frontend's log says which mechanism failed the
stream."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import httpx
import msgspec
import pytest

from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.records import InstanceRecord
from tests.frontend.conftest import BLOCK, BLOCKS, MODEL, NS, Deployment

LONG_LEASE = "300"


class LongLeaseDeployment(Deployment):
    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamoctl", *args, "--namespace", NS,
             "--discovery", self.discovery_url, "--lease-ttl", LONG_LEASE],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc


@pytest.fixture
async def two_workers(tmp_path: Path) -> AsyncIterator[LongLeaseDeployment]:
    dep = LongLeaseDeployment(tmp_path)
    try:
        for _ in range(2):
            dep.spawn(
                "worker", "worker", "--model", MODEL, "--block-size", str(BLOCK),
                "--num-gpu-blocks", str(BLOCKS), "--speedup-ratio", "1",
            )  # fmt: skip
        await dep.wait_for("worker", 2)
        await dep.start_frontend()
        yield dep
    finally:
        dep.stop()


async def migrations(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynamoctl_frontend_migrations_total{")
    )


async def test_a_killed_worker_migrates_at_once_and_gets_no_new_request(
    two_workers: LongLeaseDeployment,
) -> None:
    dep, url = two_workers, two_workers.frontend_url
    prompt = "the same long prompt " * 40  # cached where it ran: the KV router prefers it
    records = {r.pid: r for r in await dep.records("worker")}
    by_pid = {proc.pid: proc for proc in dep.procs if proc.pid in records}
    assert len(by_pid) == 2
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "stream": True,
            "ignore_eos": True}  # fmt: skip
    text, finish = "", None
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            killed = None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                choice = event["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
                if killed is None and len(text.split()) >= 20:
                    # The worker streaming this request: the one with a request running.
                    killed = await busy_worker(http, records.values())
                    by_pid[killed].kill()
                    by_pid[killed].wait()
        assert killed is not None and finish == "length"
        assert await migrations(http, url) == 1

        # Its record is still in discovery (5-minute lease), yet nothing more goes there:
        # a request sent to it would fail and migrate.
        assert killed in {r.pid for r in await dep.records("worker")}
        for _ in range(20):
            reply = await http.post(
                f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}
            )
            assert reply.status_code == 200, reply.text
        assert await migrations(http, url) == 1
    log = (dep.tmp / "frontend.log").read_text()
    assert "closed the connection" in log  # the socket monitor, not the 3 s heartbeat
    assert "sent nothing for" not in log


async def busy_worker(http: httpx.AsyncClient, records: Iterable[InstanceRecord]) -> int:
    """The pid of the worker whose ``/health`` counts a request in flight."""
    for record in records:
        assert record.health_url is not None
        health = msgspec.json.decode((await http.get(record.health_url)).content, type=WorkerHealth)
        if health.inflight:
            return record.pid
    pytest.fail("no worker reports a request in flight")
