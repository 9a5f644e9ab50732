"""A worker that dies while the router still holds it (its removal waits behind a
subscription change, as when another worker restarts at the same moment): requests picked
then go to a live worker, never fail with "just left" (issue 26, "nothing accepted is
lost at a death"). Real mocker worker processes on embedded discovery; the router is the
frontend's embedded one (:class:`ModelPools`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.router import KvRouter
from dynamoctl.router.pools import ModelPools
from tests.frontend.conftest import BLOCK, MODEL, NS, Deployment


@pytest.fixture
async def two_workers(tmp_path: Path) -> AsyncIterator[Deployment]:
    dep = Deployment(tmp_path)
    try:
        dep.worker("--speedup-ratio", "1")
        dep.worker("--speedup-ratio", "1")
        await dep.wait_for("worker", 2)
        yield dep
    finally:
        dep.stop()


async def test_a_pick_during_a_deaths_removal_goes_to_the_live_worker(
    two_workers: Deployment,
) -> None:
    dep = two_workers
    disc = Discovery(store_from_url(dep.discovery_url), lease_ttl=2)
    pools = await ModelPools.open(disc, NS, MODEL, lambda: KvRouter(block_size=BLOCK))
    try:
        await pools.main.wait_for_workers(2)
        records = {r.instance_id: r for r in await dep.records("worker")}
        dead, live = sorted(records)
        victim = next(p for p in dep.procs if p.pid == records[dead].pid)
        # A subscription change in flight holds the service's lock: the death's removal
        # from the router waits behind it while the record is already gone.
        async with pools.main._lock:
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            async with Discovery(store_from_url(dep.discovery_url), lease_ttl=2) as other:
                await other.delete(keys.instance_key(NS, "worker", "generate", dead))
            deadline = time.monotonic() + 10
            while pools.main.instance(dead) is not None:
                assert time.monotonic() < deadline, "the record's deletion never arrived"
                await asyncio.sleep(0.02)
            assert dead in pools.main.router  # the window: routable, without a record
            picked = [
                pools.pick("default", list(range(64 * i, 64 * i + 64)), f"r{i}", set())
                for i in range(6)
            ]
        assert {p.decision.worker_id for p in picked} == {live}
    finally:
        await pools.close()
        await disc.close()
