"""Embedded discovery: etcd's lease/watch semantics in a SQLite file, no server to run.

Every process on the host opens the same database file (WAL mode, so readers never block
the writer). Expiry needs no daemon: a lease stores its deadline, and every transaction
first reaps expired leases, deleting their keys and logging the deletions, so a process
killed with -9 loses its keys within TTL plus one reaping (a watching process reaps every
``REAP_INTERVAL``). Watches read an append-only change log by revision; the log is pruned,
and a watcher that fell behind the pruned head gets :class:`WatchCompacted` and re-lists,
exactly like an etcd watch. One poller per process looks at the log's head for all of its
watches (one read, no transaction) and wakes those it moved past: a deployment's every
process holds several watches, and each polling its own write transaction 20 times a
second were 3-4% of a loaded frontend's py-spy samples. The look itself is skipped while
the write-ahead log's mtime and size stand still (:meth:`EmbeddedStore.wal_mark`).

Deadlines use ``CLOCK_MONOTONIC``, which Linux shares across processes: wall-clock jumps
(NTP, an operator's ``date``) cannot expire every lease at once. Monotonic time restarts
at boot, so the file records the boot id and forgets the leases of an earlier boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dynamoctl.discovery.api import (
    EventKind,
    LeaseNotFound,
    Listing,
    Store,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
)

T = TypeVar("T")

DB_NAME = "discovery.sqlite3"
LOG_KEEP = 20_000
"""Change-log rows kept behind the head; older ones are pruned."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ttl REAL NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value BLOB NOT NULL, lease INTEGER);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease);
CREATE TABLE IF NOT EXISTS log (
    rev INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, value BLOB);
"""


def default_path() -> Path:
    """``$XDG_RUNTIME_DIR/dynamoctl`` when set, else ``~/.cache/dynamoctl``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "dynamoctl"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: monotonic clocks are then per-process, see module doc
        return f"pid-{os.getpid()}"


def _make_private(db: Path) -> None:
    """The database and its companions readable by their owner only (docs/security.md):
    created 0600 before SQLite opens it (its WAL and shared-memory files copy the
    database's mode), and files of an earlier version made private too."""
    for made in (db, db.with_name(db.name + ".open-lock")):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for suffix in ("", "-wal", "-shm", ".open-lock"):
        path = db.with_name(db.name + suffix)
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.getuid():
                path.chmod(0o600)


def _prefix_end(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"


class EmbeddedStore(Store):
    """A :class:`Store` in a SQLite file shared by the processes of one host."""

    backend = "embedded"
    POLL_INTERVAL = 0.05
    """Seconds between the poller's looks at the change log's head."""
    REAP_INTERVAL = 0.25
    """Seconds between the poller's reaping transactions (expired leases' keys deleted)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        directory = Path(path) if path else default_path()
        self._file = directory / DB_NAME if directory.suffix != ".sqlite3" else directory
        self._wal = self._file.with_name(self._file.name + "-wal")
        # One thread owns the connection: SQLite calls block, the event loop must not.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="discovery-embedded")
        self._conn: sqlite3.Connection | None = None
        self._head = _Head(self)

    @property
    def location(self) -> str:
        return str(self._file)

    # -- plumbing ---------------------------------------------------------------

    def wal_mark(self) -> tuple[int, int] | None:
        """The write-ahead log's modification time and size (None: no log yet). Every
        commit by any process writes the log, so while the mark stands still the head
        has not moved and the poller skips its look (a thread hop and a query): an idle
        process's CPU. A commit the mark misses (rewriting a reset log to the same size
        within the clock's resolution) is seen at the next reaping look."""
        try:
            st = os.stat(self._wal)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _make_private(self._file)
            # Switching to WAL and creating the schema take locks for which SQLite does
            # not always call the busy handler: processes starting together could get
            # "database is locked" at once. A lock file makes opening one at a time.
            lock = self._file.with_name(self._file.name + ".open-lock")
            with open(lock, "a") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                conn = sqlite3.connect(
                    self._file, timeout=10.0, isolation_level=None, check_same_thread=False
                )
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.executescript(_SCHEMA)
                    self._conn = conn
                    self._tx(self._forget_other_boot)
                except BaseException:
                    self._conn = None
                    conn.close()
                    raise
        return self._conn

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction, after reaping expired leases."""
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._reap(conn)
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on a snapshot (WAL: no lock taken, writers not blocked)."""
        return fn(self._connect())

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        run = self._tx if write else self._read
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, run, fn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"embedded discovery at {self._file}: {exc}") from exc

    @staticmethod
    def _forget_other_boot(conn: sqlite3.Connection) -> None:
        boot = _boot_id()
        row = conn.execute("SELECT v FROM meta WHERE k = 'boot_id'").fetchone()
        if row and row[0] != boot:
            for (key,) in conn.execute("SELECT key FROM kv WHERE lease IS NOT NULL").fetchall():
                conn.execute("INSERT INTO log (key, value) VALUES (?, NULL)", (key,))
            conn.execute("DELETE FROM kv WHERE lease IS NOT NULL")
            conn.execute("DELETE FROM leases")
        conn.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('boot_id', ?)", (boot,))

    @staticmethod
    def _reap(conn: sqlite3.Connection) -> None:
        expired = conn.execute(
            "SELECT id FROM leases WHERE expires <= ?", (time.monotonic(),)
        ).fetchall()
        for (lease,) in expired:
            EmbeddedStore._drop_lease(conn, lease)

    @staticmethod
    def _drop_lease(conn: sqlite3.Connection, lease: int) -> None:
        keys = conn.execute("SELECT key FROM kv WHERE lease = ?", (lease,)).fetchall()
        conn.executemany("INSERT INTO log (key, value) VALUES (?, NULL)", keys)
        conn.execute("DELETE FROM kv WHERE lease = ?", (lease,))
        conn.execute("DELETE FROM leases WHERE id = ?", (lease,))

    @staticmethod
    def _log(conn: sqlite3.Connection, key: str, value: bytes | None) -> None:
        cur = conn.execute("INSERT INTO log (key, value) VALUES (?, ?)", (key, value))
        rev = cur.lastrowid or 0
        if rev % 1000 == 0:  # prune rarely; pruning is what WatchCompacted reports
            conn.execute("DELETE FROM log WHERE rev <= ?", (rev - LOG_KEEP,))

    @staticmethod
    def _revision(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'log'").fetchone()
        return int(row[0]) if row else 0

    # -- Store ------------------------------------------------------------------

    async def grant(self, ttl: float) -> int:
        def grant(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO leases (ttl, expires) VALUES (?, ?)", (ttl, time.monotonic() + ttl)
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

        return await self._run(grant)

    async def keepalive(self, lease: int) -> bool:
        def refresh(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE leases SET expires = ? + ttl WHERE id = ?", (time.monotonic(), lease)
            )
            return cur.rowcount == 1

        return await self._run(refresh)

    async def revoke(self, lease: int) -> None:
        await self._run(lambda conn: self._drop_lease(conn, lease))

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        def put(conn: sqlite3.Connection) -> None:
            if (
                lease is not None
                and not conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone()
            ):
                raise LeaseNotFound(f"lease {lease} not found in {self._file}")
            conn.execute(
                "INSERT OR REPLACE INTO kv (key, value, lease) VALUES (?, ?, ?)",
                (key, value, lease),
            )
            self._log(conn, key, value)

        await self._run(put)

    async def replace(self, key: str, old: bytes | None, new: bytes) -> bool:
        def replace(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            if (bytes(row[0]) if row else None) != old:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO kv (key, value, lease) VALUES (?, ?, NULL)", (key, new)
            )
            self._log(conn, key, new)
            return True

        return await self._run(replace)

    async def delete(self, key: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if conn.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount == 0:
                return False
            self._log(conn, key, None)
            return True

        return await self._run(delete)

    async def get(self, key: str) -> bytes | None:
        def get(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return bytes(row[0]) if row else None

        return await self._run(get)

    async def list(self, prefix: str) -> Listing:
        def listing(conn: sqlite3.Connection) -> Listing:
            rows = conn.execute(
                "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, _prefix_end(prefix)),
            ).fetchall()
            return Listing({k: bytes(v) for k, v in rows}, self._revision(conn))

        return await self._run(listing)

    async def watch(self, prefix: str, after: int) -> AsyncIterator[WatchEvent]:
        def changes(conn: sqlite3.Connection) -> tuple[int, list[tuple[str, bytes | None]]]:
            oldest = conn.execute("SELECT MIN(rev) FROM log").fetchone()[0]
            if oldest is not None and oldest > after + 1:
                raise WatchCompacted(f"revision {after} pruned (oldest kept: {oldest})")
            rows = conn.execute(
                "SELECT key, value FROM log WHERE rev > ? AND key >= ? AND key < ? ORDER BY rev",
                (after, prefix, _prefix_end(prefix)),
            ).fetchall()
            # Advance to the head even when nothing matched, so churn on other
            # prefixes never makes this watcher look compacted.
            return self._revision(conn), rows

        while True:
            after, rows = await self._run(changes, write=False)
            for key, value in rows:
                if value is None:
                    yield WatchEvent(EventKind.DELETE, key)
                else:
                    yield WatchEvent(EventKind.PUT, key, bytes(value))
            await self._head.moved_past(after)

    async def close(self) -> None:
        self._head.stop()
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


class _Head:
    """The change log's head as one poller per process sees it, for all of its watches: a
    watch that has read up to a revision waits here until the head moves past it. The
    poller runs while some watch waits; every ``REAP_INTERVAL`` its look is a transaction,
    which reaps expired leases (their deletions move the head)."""

    def __init__(self, store: EmbeddedStore) -> None:
        self._store = store
        self._revision = 0
        self._waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._moved = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._error: StoreUnavailable | None = None

    async def moved_past(self, revision: int) -> None:
        """Return once the head is past ``revision``; the poller's error if it failed."""
        self._start()
        self._waiting += 1
        try:
            while self._revision <= revision:
                await self._moved.wait()
                if self._error is not None:
                    raise self._error
        finally:
            self._waiting -= 1

    def stop(self) -> None:
        """The store is closing: the poller ends and a watch still waiting fails."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
            self._error = StoreUnavailable(f"embedded discovery at {self._store.location}: closed")
            self._wake()

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests run several): start afresh
            self._loop, self._moved, self._poller = loop, asyncio.Event(), None
        if self._poller is None or self._poller.done():
            self._error = None
            self._poller = loop.create_task(self._poll(), name="discovery-embedded-head")

    async def _poll(self) -> None:
        store = self._store
        reap_at = 0.0
        seen: tuple[int, int] | None = None
        try:
            while self._waiting:
                write = time.monotonic() >= reap_at
                if write:
                    reap_at = time.monotonic() + store.REAP_INTERVAL
                # Taken before the look: a commit after it changes the mark for the next.
                mark = store.wal_mark()
                if write or mark is None or mark != seen:
                    head = await store._run(store._revision, write=write)
                    seen = mark
                    if head != self._revision:
                        self._revision = head
                        self._wake()
                await asyncio.sleep(store.POLL_INTERVAL)
        except StoreUnavailable as exc:
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()
