"""etcd outages: the server stops, restarts (with or without its data), or never answers.

Each test owns its etcd process, since it kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamoctl.discovery import (
    Discovery,
    DiscoveryUnavailable,
    EventKind,
    StoreUnavailable,
    WatchEvent,
    store_from_url,
)
from dynamoctl.discovery.etcd import EtcdStore
from dynamoctl.discovery.etcd_server import ManagedEtcd
from tests.infra.ports import free_port

TTL = 2.0
FREEZE = 3 * TTL
"""A SIGSTOP long enough that every lease expires when etcd resumes."""
OWNER = Path(__file__).with_name("owner.py")


@pytest.fixture
def etcd() -> Iterator[ManagedEtcd]:
    with ManagedEtcd(client_port=free_port(), peer_port=free_port()) as server:
        yield server


def url_of(server: ManagedEtcd) -> str:
    return f"etcd://{server.host}:{server.client_port}"


async def eventually(check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except Exception:  # the store may still be coming back
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"not recovered within {timeout}s")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("wipe", [False, True], ids=["data-kept", "data-wiped"])
async def test_registration_and_watch_survive_etcd_restart(etcd: ManagedEtcd, wipe: bool) -> None:
    key = "ns/instances/worker/generate/w1"
    async with (
        Discovery(store_from_url(url_of(etcd)), lease_ttl=TTL) as owner,
        Discovery(store_from_url(url_of(etcd)), lease_ttl=TTL) as observer,
    ):
        await owner.register(key, b"w1")
        view: dict[str, bytes] = {}
        seen_puts = 0

        async def follow() -> None:
            nonlocal seen_puts
            async for event in observer.watch("ns/"):
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    view[event.key] = event.value
                    seen_puts += 1
                else:
                    view.pop(event.key, None)

        watcher = asyncio.create_task(follow())
        await eventually(lambda: _true(view.get(key) == b"w1"), 5)

        etcd.kill()
        if wipe:
            etcd.wipe()
        await asyncio.sleep(1.0)  # outage shorter than the TTL: nothing should be lost
        etcd.start()

        async def registered() -> bool:
            return await observer.get(key) == b"w1"

        await eventually(registered, TTL * 2 + 10)  # generous: CI machines are loaded
        # The watch heals by re-listing: its view converges on the store's.
        await eventually(lambda: _true(view == {key: b"w1"}), 10)
        if wipe:
            assert owner.lease_epoch >= 2, "a wiped etcd forgets the lease: a new one is due"
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(watcher, 10)


async def _true(value: bool) -> bool:
    return value


async def test_unreachable_etcd_names_endpoint_and_gives_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    caplog.set_level(logging.WARNING)
    disc = Discovery(store_from_url(f"etcd://127.0.0.1:{port}"), lease_ttl=TTL, connect_timeout=1.5)
    started = time.monotonic()
    with pytest.raises(DiscoveryUnavailable) as info:
        await disc.start()
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"http://127.0.0.1:{port}" in message
    assert "unreachable" in message
    assert any("retrying" in r.getMessage() for r in caplog.records)
    await disc.store.close()


async def test_fails_over_to_a_live_endpoint(etcd: ManagedEtcd) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    store = EtcdStore([dead, etcd.endpoint], request_timeout=0.5)
    async with Discovery(store, lease_ttl=TTL, connect_timeout=10) as disc:
        await disc.register("ns/k", b"v")
        assert await disc.get("ns/k") == b"v"
        assert store.location == etcd.endpoint


def test_bad_endpoints_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="all https:// or all http://"):
        EtcdStore(["https://10.0.0.1:2379", "http://10.0.0.2:2379"])  # no downgrade
    with pytest.raises(ValueError, match="at least one endpoint"):
        EtcdStore([])
    with pytest.raises(ValueError, match="valid: embedded, etcd"):
        store_from_url("zookeeper://x:1")


def test_managed_etcd_reports_a_missing_binary() -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install etcd-server"):
        ManagedEtcd(binary="etcd-does-not-exist").start()


def test_a_started_etcd_entered_as_a_context_is_not_started_again(
    etcd_server: ManagedEtcd,
) -> None:
    """conftest's ``with ManagedEtcd(...).start(timeout=60) as server``: entering used to
    start a second etcd on the same ports, which failed the session whenever it exited
    (bind: address in use) before the first health check, and orphaned the first."""
    assert etcd_server.running
    pid = etcd_server.pid
    with pytest.raises(RuntimeError, match="already running"):
        etcd_server.start()
    assert etcd_server.__enter__() is etcd_server and etcd_server.pid == pid


def test_lease_ttl_below_etcd_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="lease_ttl must be >= 2"):
        Discovery(store_from_url("embedded:///tmp/never-used"), lease_ttl=1)


@contextlib.contextmanager
def frozen(server: ManagedEtcd) -> Iterator[None]:
    """etcd stopped (SIGSTOP) for the block: connections stay open, nothing answers."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_every_background_task_survives_a_freeze_past_the_lease_ttl(
    etcd: ManagedEtcd,
) -> None:
    """A freeze longer than the lease TTL used to end keepalive, watch and caller tasks
    with a CancelledError (the store closed its channel under calls in flight). Two
    endpoints (the second dead) make the observer's store fail over and back under load."""
    dead = f"http://127.0.0.1:{free_port()}"
    observed = EtcdStore([etcd.endpoint, dead], request_timeout=0.5)
    async with (
        Discovery(store_from_url(url_of(etcd)), lease_ttl=TTL) as owner,
        Discovery(observed, lease_ttl=TTL, connect_timeout=10) as observer,
    ):
        await owner.register("ns/a", b"1")
        view: dict[str, bytes] = {}
        errors: list[str] = []

        async def follow() -> None:
            async for event in observer.watch("ns/"):
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    view[event.key] = event.value
                else:
                    view.pop(event.key, None)

        async def poll() -> None:  # what the supervisor's probes do, several at once
            while True:
                try:
                    await observer.list("ns/")
                except StoreUnavailable:
                    pass
                except Exception as exc:  # anything else would end a probe
                    errors.append(repr(exc))
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(follow()), *(asyncio.create_task(poll()) for _ in range(3))]
        await eventually(lambda: _true(view == {"ns/a": b"1"}), 5)
        with frozen(etcd):
            await asyncio.sleep(FREEZE)
            assert not observer.reachable and observer.settling()
        await eventually(lambda: _true(observer.reachable and owner.lease_epoch >= 2), 15)
        await owner.register("ns/b", b"2")  # written after the outage: the watch still works
        await eventually(lambda: _true(view == {"ns/a": b"1", "ns/b": b"2"}), 10)
        assert observer._keepalive is not None and not observer._keepalive.done()
        assert [t for t in tasks if t.done()] == [] and errors == []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def spawn_owner(url: str, key: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(OWNER), url, key, "v", str(TTL)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
    return proc


async def test_a_held_watch_serves_stale_keys_through_mass_expiry(etcd: ManagedEtcd) -> None:
    """After a freeze past the TTL every lease expires at once. A plain watch sees every
    key deleted, then written again; a watch with ``hold`` sees no deletion of a key whose
    owner lives, and the deletion of one whose owner died during the freeze as soon as
    its liveness check says so."""
    url = url_of(etcd)
    live, dead = spawn_owner(url, "ns/live"), spawn_owner(url, "ns/dead")
    try:
        async with Discovery(store_from_url(url), lease_ttl=TTL) as observer:
            owners = {"ns/live": live, "ns/dead": dead}

            async def alive(key: str) -> bool:
                return owners[key].poll() is None

            plain: list[WatchEvent] = []
            held: list[WatchEvent] = []

            async def follow(hold: bool) -> None:
                # Held far longer than the test waits: only the check can release it.
                async for event in observer.watch("ns/", hold=hold, alive=alive, hold_for=600):
                    if hold:
                        held.append(event)
                    else:
                        plain.append(event)

            tasks = [asyncio.create_task(follow(False)), asyncio.create_task(follow(True))]
            await eventually(lambda: _true(len(plain) == 2 and len(held) == 2), 5)
            with frozen(etcd):
                await asyncio.sleep(FREEZE)
                dead.kill()
                dead.wait()
            deleted = WatchEvent(EventKind.DELETE, "ns/dead")
            await eventually(lambda: _true(deleted in held), 10)
            await eventually(lambda: _true(plain.count(deleted) == 1), 10)
            # The premise: the live owner's lease expired too, and it wrote its key again.
            assert WatchEvent(EventKind.DELETE, "ns/live") in plain
            assert plain[-1] != WatchEvent(EventKind.DELETE, "ns/live")
            assert WatchEvent(EventKind.DELETE, "ns/live") not in held
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for proc in (live, dead):
            proc.kill()
            proc.wait()
