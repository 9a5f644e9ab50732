"""One conformance suite, run against every discovery backend (a real etcd and embedded).

Owners that must die are real processes (tests/discovery/owner.py) killed with real
signals; expiry bounds are asserted as TTL plus a margin generous enough for a loaded
2-core CI machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, EventKind, WatchEvent, store_from_url
from dynamoctl.discovery.etcd_server import ManagedEtcd

TTL = 2.0
MARGIN = 2.5
OWNER = Path(__file__).with_name("owner.py")


@pytest.fixture(params=["embedded", "etcd"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "embedded":
        return f"embedded://{tmp_path}"
    server: ManagedEtcd = request.getfixturevalue("etcd_server")
    return f"etcd://{server.host}:{server.client_port}"


@pytest.fixture
def prefix() -> str:
    """A namespace no other test touches (the etcd server is shared)."""
    return f"t-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def disc(url: str) -> AsyncIterator[Discovery]:
    async with Discovery(store_from_url(url), lease_ttl=TTL) as d:
        yield d


SpawnOwner = Callable[[str, str], "subprocess.Popen[str]"]


@pytest.fixture
def spawn_owner(url: str) -> Iterator[SpawnOwner]:
    procs: list[subprocess.Popen[str]] = []

    def spawn(key: str, value: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(OWNER), url, key, value, str(TTL)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "registered"
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


async def wait_for(predicate_coro: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Poll an async predicate until true; returns seconds taken, fails on timeout."""
    start = time.monotonic()
    while not await predicate_coro():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def next_event(events: AsyncIterator[WatchEvent], timeout: float = 5.0) -> WatchEvent:
    return await asyncio.wait_for(events.__anext__(), timeout)


async def test_register_get_unregister(disc: Discovery, prefix: str) -> None:
    key = f"{prefix}instances/worker/generate/a1"
    assert await disc.get(key) is None
    await disc.register(key, b'{"address": "tcp://127.0.0.1:5000"}')
    assert await disc.get(key) == b'{"address": "tcp://127.0.0.1:5000"}'
    await disc.register(key, b"v2")  # re-register replaces
    assert await disc.get(key) == b"v2"
    await disc.unregister(key)
    assert await disc.get(key) is None


async def test_delete_says_whether_the_key_was_there(disc: Discovery, prefix: str) -> None:
    await disc.put(f"{prefix}here", b"x")
    assert await disc.delete(f"{prefix}here") is True
    assert await disc.delete(f"{prefix}here") is False  # etcd used to raise AttributeError
    assert await disc.delete(f"{prefix}never-written") is False


async def test_replace_is_a_compare_and_set(disc: Discovery, prefix: str) -> None:
    """Shared limits (frontend/tenants/shared.py) count on it: of writers racing from the
    same value, exactly one wins."""
    key = f"{prefix}limits/alice/tokens"
    assert await disc.store.replace(key, b"x", b"y") is False  # absent is not b"x"
    assert await disc.store.get(key) is None
    assert await disc.store.replace(key, None, b"1") is True  # created
    assert await disc.store.replace(key, None, b"2") is False  # exists now
    assert await disc.store.replace(key, b"0", b"2") is False
    assert await disc.store.get(key) == b"1"
    # None of the racers writes b"1" back: one that did could win first and leave the
    # value a second racer then rightly replaces (etcd once ran them in that order).
    racing = await asyncio.gather(
        *(disc.store.replace(key, b"1", b"racer-%d" % n) for n in range(8))
    )
    assert sum(racing) == 1
    assert await disc.store.get(key) == b"racer-%d" % racing.index(True)


async def test_list_by_prefix(disc: Discovery, prefix: str) -> None:
    await disc.register(f"{prefix}models/m/1", b"a")
    await disc.register(f"{prefix}models/m/2", b"b")
    await disc.register(f"{prefix}models/mm/3", b"c")  # shares the string prefix "m"
    await disc.register(f"{prefix}instances/w/g/1", b"d")
    assert await disc.list(f"{prefix}models/m/") == {
        f"{prefix}models/m/1": b"a",
        f"{prefix}models/m/2": b"b",
    }
    assert len(await disc.list(prefix)) == 4
    assert await disc.list(f"{prefix}nothing/") == {}


async def test_watch_sees_initial_put_and_delete(disc: Discovery, prefix: str) -> None:
    await disc.register(f"{prefix}k0", b"before")
    events = disc.watch(prefix)
    assert await next_event(events) == WatchEvent(EventKind.PUT, f"{prefix}k0", b"before")
    await disc.register(f"{prefix}k1", b"v1")
    await disc.put(f"{prefix}other/outside", b"x")  # same prefix: seen
    await disc.unregister(f"{prefix}k0")
    await disc.delete(f"{prefix}other/outside")
    got = [await next_event(events) for _ in range(4)]
    assert got == [
        WatchEvent(EventKind.PUT, f"{prefix}k1", b"v1"),
        WatchEvent(EventKind.PUT, f"{prefix}other/outside", b"x"),
        WatchEvent(EventKind.DELETE, f"{prefix}k0"),
        WatchEvent(EventKind.DELETE, f"{prefix}other/outside"),
    ]
    await events.aclose()


async def test_watch_without_initial_skips_existing(disc: Discovery, prefix: str) -> None:
    await disc.register(f"{prefix}old", b"x")
    events = disc.watch(prefix, initial=False)
    waiting = asyncio.ensure_future(next_event(events))
    await asyncio.sleep(0.3)  # let the watch list and subscribe before the next write
    await disc.register(f"{prefix}new", b"y")
    assert await waiting == WatchEvent(EventKind.PUT, f"{prefix}new", b"y")
    await events.aclose()


async def test_key_expires_after_owner_killed(
    disc: Discovery, prefix: str, spawn_owner: SpawnOwner
) -> None:
    key = f"{prefix}instances/worker/generate/victim"
    owner = spawn_owner(key, "alive")
    assert await disc.get(key) == b"alive"
    events = disc.watch(prefix)
    assert (await next_event(events)).kind is EventKind.PUT
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    killed = time.monotonic()
    event = await next_event(events, timeout=TTL + MARGIN + 2)
    elapsed = time.monotonic() - killed
    assert event == WatchEvent(EventKind.DELETE, key)
    assert elapsed <= TTL + MARGIN, f"key outlived its owner by {elapsed:.2f}s (TTL {TTL}s)"
    assert await disc.get(key) is None
    await events.aclose()


async def test_keepalive_holds_past_ttl(disc: Discovery, prefix: str) -> None:
    key = f"{prefix}instances/worker/generate/steady"
    await disc.register(key, b"v")
    deadline = time.monotonic() + 2.5 * TTL
    while time.monotonic() < deadline:
        assert await disc.get(key) == b"v"
        await asyncio.sleep(0.2)
    assert disc.lease_epoch == 1, "keepalive should have held the first lease"


async def test_lease_loss_reregisters_instead_of_exiting(
    disc: Discovery, prefix: str, spawn_owner: SpawnOwner
) -> None:
    """Freeze the owner past its TTL: its key expires; thawed, it re-registers and lives."""
    key = f"{prefix}instances/worker/generate/sleepy"
    owner = spawn_owner(key, "v")
    owner.send_signal(signal.SIGSTOP)

    async def gone() -> bool:
        return await disc.get(key) is None

    async def back() -> bool:
        return await disc.get(key) == b"v"

    await wait_for(gone, TTL + MARGIN)
    owner.send_signal(signal.SIGCONT)
    # The owner's next keepalive (≤ TTL/3 after thawing) finds the lease gone.
    await wait_for(back, TTL + MARGIN)
    assert owner.poll() is None, "lease loss must not end the process"


async def test_close_revokes_keys_immediately(url: str, prefix: str) -> None:
    key = f"{prefix}instances/frontend/http/f1"
    async with Discovery(store_from_url(url), lease_ttl=10) as owner:
        await owner.register(key, b"v")
    # TTL is 10 s: the key can only be gone this fast because close() revoked the lease.
    async with Discovery(store_from_url(url), lease_ttl=TTL) as reader:
        assert await reader.get(key) is None


def test_grpc_fork_handlers_are_off_in_every_dynamoctl_process() -> None:
    """A process that loads the etcd client forks only to exec (squeue, ssh): gRPC's fork
    handlers must be off before gRPC loads, or a child forked while another thread is in
    gRPC can abort before its exec (a supervisor's squeue died of SIGABRT in CI)."""
    probe = (
        "import os; os.environ.pop('GRPC_ENABLE_FORK_SUPPORT', None)\n"
        "import dynamoctl.discovery.etcd, grpc\n"
        "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "false", out.stderr
