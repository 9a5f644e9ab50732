"""Stale-while-unavailable, as a client of the frontend sees it: real etcd, a real mocker
worker process and a real frontend process (docs/discovery.md, "Stale while unavailable")."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dynamoctl.discovery.etcd_server import ManagedEtcd
from tests.frontend.conftest import MODEL, Deployment
from tests.infra.ports import free_port

TTL = 2.0
FREEZE = 3 * TTL
"""Long enough that every lease expires at once when etcd resumes."""


@dataclass
class EtcdDeployment(Deployment):
    etcd_url: str = ""

    @property
    def discovery_url(self) -> str:
        return self.etcd_url


@pytest.fixture
def etcd() -> Iterator[ManagedEtcd]:
    with ManagedEtcd(client_port=free_port(), peer_port=free_port()) as server:
        yield server


@pytest.fixture
async def deployment(tmp_path: Path, etcd: ManagedEtcd) -> AsyncIterator[EtcdDeployment]:
    dep = EtcdDeployment(tmp_path, etcd_url=f"etcd://{etcd.host}:{etcd.client_port}")
    try:
        dep.worker("--num-workers", "2", "--speedup-ratio", "20")
        await dep.wait_for("worker", 2)
        await dep.start_frontend()
        yield dep
    finally:
        dep.stop()


async def complete(http: httpx.AsyncClient, dep: Deployment, model: str = MODEL) -> httpx.Response:
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
    return await http.post(f"{dep.frontend_url}/v1/completions", json=body, timeout=30)


async def test_a_served_model_gets_no_404_through_mass_lease_expiry(
    deployment: EtcdDeployment, etcd: ManagedEtcd
) -> None:
    """etcd frozen past the lease TTL, then resumed: every lease expires at once and the
    workers write their records again a moment later. Requests sent all along, during
    the freeze and through the expiry, are all answered."""
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def client() -> None:
        async with httpx.AsyncClient() as http:
            while not stop.is_set():
                resp = await complete(http, deployment)
                statuses[resp.status_code] += 1
                if resp.status_code != 200:
                    print(resp.status_code, resp.text)
                await asyncio.sleep(0.02)

    clients = [asyncio.create_task(client()) for _ in range(3)]
    assert etcd.pid is not None
    try:
        await asyncio.sleep(0.5)
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(FREEZE)
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        await asyncio.sleep(3 * TTL)  # leases expire, workers re-register, holds end
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert statuses[200] > 50, statuses
    assert set(statuses) == {200}, statuses  # no 404, no 503: the workers never stopped
    log = (deployment.tmp / "frontend.log").read_text()
    assert "deletions held" in log, "the premise: leases expired en masse and were held"
    # Neither the model nor a worker was dropped, even for a moment.
    assert "has no workers left" not in log and "removed" not in log, log


async def test_a_model_without_workers_is_503_and_one_never_served_404(
    deployment: EtcdDeployment,
) -> None:
    async with httpx.AsyncClient() as http:
        assert (await complete(http, deployment)).status_code == 200
        for proc in deployment.procs[:1]:  # the worker process: both its workers die
            proc.kill()
            proc.wait()
        models_url = f"{deployment.frontend_url}/v1/models"
        for _ in range(200):  # the lease expires within its TTL; not held (no outage)
            if not (await http.get(models_url)).json()["data"]:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the model outlived its workers' leases")
        gone = await complete(http, deployment)
        assert gone.status_code == 503, gone.text
        assert gone.json()["error"]["code"] == "model_unavailable"
        assert gone.headers["Retry-After"] == "1"
        never = await complete(http, deployment, model="never-served")
        assert never.status_code == 404 and never.json()["error"]["code"] == "model_not_found"
