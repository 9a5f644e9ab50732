"""The supervisor withdraws a dead instance's discovery records at once, against a real
etcd: leases here are 5 minutes, so a record that vanishes was withdrawn, not expired."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest

from dynamoctl.discovery import Discovery, EventKind, WatchEvent, keys, store_from_url
from dynamoctl.discovery.etcd_server import ManagedEtcd
from dynamoctl.supervisor.withdraw import RecordWithdrawal
from dynamoctl.wire.records import EventsRecord, InstanceRecord, encode_json
from tests.infra.ports import free_port
from tests.supervisor.conftest import Cli, mocker_recipe

LEASE_TTL = 300.0


def etcd_url(server: ManagedEtcd) -> str:
    return f"etcd://{server.endpoint.removeprefix('http://')}"


def instance(iid: str, label: str, component: str = "worker") -> InstanceRecord:
    return InstanceRecord(
        instance_id=iid, component=component, endpoint="generate",
        address="tcp://127.0.0.1:1", host="h", pid=1, label=label,
    )  # fmt: skip


EVENTS = EventsRecord(
    kv="tcp://127.0.0.1:2", kv_replay=None, kv_topic="kv",
    load="tcp://127.0.0.1:3", load_replay=None, load_topic="load",
)  # fmt: skip


async def test_withdraws_the_named_instance_records_only(etcd_server: ManagedEtcd) -> None:
    ns, url = "withdraw-unit", etcd_url(etcd_server)
    async with Discovery(store_from_url(url), lease_ttl=LEASE_TTL) as disc:
        mine = {
            keys.instance_key(ns, "worker", "generate", "h-1-a"): encode_json(
                instance("h-1-a", "agg-0")
            ),
            keys.instance_key(ns, "worker", "generate", "h-1-b"): encode_json(
                instance("h-1-b", "agg-0")
            ),  # a second instance of the same process (--num-workers 2)
            keys.events_key(ns, "worker", "h-1-a"): encode_json(EVENTS),
        }
        others = {
            keys.instance_key(ns, "worker", "generate", "h-2-a"): encode_json(
                instance("h-2-a", "agg-1")
            ),
            keys.events_key(ns, "worker", "h-2-a"): encode_json(EVENTS),
            keys.model_key(ns, "mock-llama", "h-1-a"): b"{}",  # cards are left to the lease
            keys.instance_key(ns, "worker", "generate", "foreign"): b"not json",
        }
        for key, value in {**mine, **others}.items():
            await disc.register(key, value)
        withdrawal = RecordWithdrawal(url, ns)
        try:
            assert sorted(await withdrawal.withdraw("agg-0")) == sorted(mine)
            assert await withdrawal.withdraw("agg-0") == []  # nothing left: no error
        finally:
            await withdrawal.close()
        assert set(await disc.list(f"{ns}/")) == set(others)


async def test_an_unreachable_discovery_is_not_an_error() -> None:
    withdrawal = RecordWithdrawal(f"etcd://127.0.0.1:{free_port()}", "nowhere")
    try:
        assert await withdrawal.withdraw("agg-0") == []
    finally:
        await withdrawal.close()


async def test_a_killed_worker_leaves_discovery_before_its_lease_expires(
    cli: Cli, etcd_server: ManagedEtcd
) -> None:
    name = "withdraw-e2e"
    extra = (
        f"discovery: {{backend: etcd, endpoints: ['{etcd_server.endpoint}'], "
        f"lease_ttl: {LEASE_TTL:g}}}\n"
    )
    recipe = cli.recipe(mocker_recipe(name, free_port(), replicas=1, extra=extra))
    up = await asyncio.to_thread(cli, "up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    try:
        row = next(r for r in cli.status()["instances"] if r["name"] == "agg-0")
        prefix = keys.instances_prefix(name, "worker")
        async with Discovery(store_from_url(etcd_url(etcd_server)), lease_ttl=10) as disc:
            (key,) = await disc.list(prefix)
            watch = disc.watch(prefix)
            await asyncio.wait_for(_first(watch, EventKind.PUT, key), 30)  # listed first
            worker = psutil.Process(row["pid"]).children()[0]  # the keeper's child
            os.kill(worker.pid, signal.SIGKILL)
            # Far inside the 5-minute lease: only the supervisor can have removed it.
            await asyncio.wait_for(_first(watch, EventKind.DELETE, key), 60)
            await watch.aclose()

        def restarted(report: dict[str, Any]) -> bool:
            row = next(r for r in report["instances"] if r["name"] == "agg-0")
            return bool(row["state"] == "READY" and row["restarts"] == 1)

        await asyncio.to_thread(cli.wait_for, restarted, 60.0, "agg-0 restarted")
    finally:
        down = await asyncio.to_thread(cli, "down", name)
        assert down.returncode == 0, down.stderr


async def _first(watch: AsyncIterator[WatchEvent], kind: EventKind, key: str) -> None:
    async for event in watch:
        if event.kind is kind and event.key == key:
            return
    pytest.fail("watch ended")
