"""Embedded-backend specifics: compaction, reboot, concurrency between processes."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from dynamoctl.discovery import EventKind, WatchCompacted, WatchEvent
from dynamoctl.discovery import embedded as embedded_mod
from dynamoctl.discovery.client import Discovery
from dynamoctl.discovery.embedded import EmbeddedStore


async def test_watch_behind_pruned_log_raises_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_mod, "LOG_KEEP", 10)
    store = EmbeddedStore(tmp_path)
    for i in range(1100):  # crosses the every-1000-revisions prune
        await store.put(f"k/{i}", b"v")
    with pytest.raises(WatchCompacted):
        async for _ in store.watch("k/", after=5):
            pass
    await store.close()


async def test_discovery_watch_heals_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(embedded_mod, "LOG_KEEP", 10)
    monkeypatch.setattr(EmbeddedStore, "POLL_INTERVAL", 1.0)  # let the writer outrun it
    async with Discovery(EmbeddedStore(tmp_path), lease_ttl=2) as disc:
        await disc.put("a/seen", b"1")
        events = disc.watch("a/")
        assert (await events.__anext__()).key == "a/seen"
        writer = EmbeddedStore(tmp_path)
        # Enough writes to prune past the watcher, faster than it polls.
        for i in range(1100):
            await writer.put(f"b/{i}", b"x")
        await writer.delete("a/seen")
        await writer.put("a/new", b"2")
        got = {(e.kind, e.key) for e in [await events.__anext__(), await events.__anext__()]}
        assert got == {(EventKind.DELETE, "a/seen"), (EventKind.PUT, "a/new")}
        await events.aclose()
        await writer.close()
    assert any("re-listing" in r.getMessage() for r in caplog.records)


async def test_leases_of_an_earlier_boot_are_forgotten(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path)
    lease = await store.grant(3600)
    await store.put("ns/leased", b"v", lease)
    await store.put("ns/durable", b"v")
    await store.close()
    with sqlite3.connect(tmp_path / embedded_mod.DB_NAME) as conn:
        conn.execute("UPDATE meta SET v = 'another-boot' WHERE k = 'boot_id'")
    store = EmbeddedStore(tmp_path)
    assert (await store.list("ns/")).items == {"ns/durable": b"v"}
    assert not await store.keepalive(lease)
    await store.close()


def test_many_processes_write_concurrently(tmp_path: Path) -> None:
    """Four processes, 200 leased writes each, no lock errors, nothing lost."""
    script = (
        "import asyncio, sys\n"
        "from dynamoctl.discovery.embedded import EmbeddedStore\n"
        "async def main(n):\n"
        "    s = EmbeddedStore(sys.argv[1]); lease = await s.grant(60)\n"
        "    for i in range(200): await s.put(f'p/{n}/{i}', b'v', lease)\n"
        "    await s.close()\n"
        "asyncio.run(main(sys.argv[2]))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(n)]) for n in range(4)
    ]
    assert [p.wait(60) for p in procs] == [0, 0, 0, 0]

    async def count() -> int:
        store = EmbeddedStore(tmp_path)
        try:
            return len((await store.list("p/")).items)
        finally:
            await store.close()

    assert asyncio.run(count()) == 800


def test_default_path_follows_xdg_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert embedded_mod.default_path() == Path("/run/user/1234/dynamoctl")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert embedded_mod.default_path() == Path.home() / ".cache" / "dynamoctl"


T = TypeVar("T")


class _CountingStore(EmbeddedStore):
    """Counts write transactions (each takes SQLite's write lock, for every process) and
    reads."""

    transactions = 0
    reads = 0

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self.transactions += 1
        return super()._tx(fn)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self.reads += 1
        return super()._read(fn)


async def test_idle_watches_share_one_poller_and_take_no_write_lock_per_look(
    tmp_path: Path,
) -> None:
    """Four watches on a quiet store for a second: one reaping transaction per
    REAP_INTERVAL between them (each watch's own transaction 20 times a second before:
    ~80) and no read between those; another connection's put still reaches every watch,
    and a lease that lapses is still reaped."""
    store = _CountingStore(tmp_path)
    await store.put("w/a", b"1")
    head = (await store.list("w/")).revision
    watches = [store.watch(f"w/{name}", head) for name in "abcd"]
    pending = [asyncio.ensure_future(w.__anext__()) for w in watches]
    await asyncio.sleep(0.2)  # the watches' first reads of the log
    before, reads = store.transactions, store.reads
    await asyncio.sleep(1.0)
    quiet = store.transactions - before
    assert quiet <= 1.0 / store.REAP_INTERVAL + 2, quiet
    # Between reapings the log does not move: no look at all (~16 a second before).
    assert store.reads - reads <= 1, store.reads - reads
    assert not any(p.done() for p in pending)
    writer = EmbeddedStore(tmp_path)  # its own connection, as another process's
    await writer.put("w/c", b"2")
    await writer.close()
    done, _ = await asyncio.wait(pending, timeout=5)
    assert [p.result().key for p in done] == ["w/c"]
    for p in pending:
        p.cancel()
    lapsing = store.watch("w/d", (await store.list("w/")).revision)
    lease = await store.grant(0.3)
    await store.put("w/d", b"3", lease)
    events = [e async for e in _take(lapsing, 2)]
    assert [(e.kind, e.key) for e in events] == [(EventKind.PUT, "w/d"), (EventKind.DELETE, "w/d")]
    await store.close()


async def _take(watch: AsyncIterator[WatchEvent], count: int) -> AsyncIterator[WatchEvent]:
    async for event in watch:
        yield event
        count -= 1
        if count == 0:
            return
