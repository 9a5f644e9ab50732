"""A process's handle on discovery: one lease kept alive, keys registered under it,
watches that survive outages.

Policy (docs/discovery.md): losing the lease never ends the process. The keepalive loop notices
(the store says the lease is gone, or a put names a dead lease), grants a new lease with
jittered backoff and writes every registered key again. Dynamo instead exits on lease
loss (ai-dynamo issue #3493); a 70B worker that takes ten minutes to load must not die
because etcd blinked.

No outage ends a background task: the keepalive loop and every watch treat any failure of
the store (a ``CancelledError`` of a gRPC call included, unless our own task is being
cancelled) as "unreachable, retry". The handle also says whether discovery is reachable
(:attr:`Discovery.reachable`) and whether it is *settling* (:meth:`Discovery.settling`),
which watches with ``hold`` use to serve stale records while leases are re-established
(:mod:`dynamoctl.discovery.hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from dynamoctl.discovery.api import (
    DiscoveryError,
    EventKind,
    LeaseNotFound,
    Store,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
)
from dynamoctl.discovery.hold import AliveCheck, hold_deletes
from dynamoctl.util.aio import raise_if_cancel_requested
from dynamoctl.util.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")


class DiscoveryUnavailable(DiscoveryError):
    """Discovery could not be reached within the caller's bound."""


class Discovery:
    """Registration and lookup for one process.

    Use as ``async with Discovery(store, lease_ttl=10) as disc: await disc.register(...)``.
    Keys given to :meth:`register` live exactly as long as this process keeps its lease;
    :meth:`close` revokes the lease so they vanish at once on a clean exit.
    """

    def __init__(self, store: Store, lease_ttl: float = 10.0, connect_timeout: float = 30.0):
        if lease_ttl < 2:
            raise ValueError(f"lease_ttl must be >= 2 s (etcd's floor), got {lease_ttl}")
        self.store = store
        self.lease_ttl = lease_ttl
        self.connect_timeout = connect_timeout
        self.lease_epoch = 0
        """Incremented on every lease grant: 1 after start, +1 per recovery."""
        self._lease: int | None = None
        self._registered: dict[str, bytes] = {}
        self._dirty = False  # some registered key may be missing from the store
        self._keepalive: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # serialises lease (re)grants with registrations
        self._down_since: float | None = None
        self._disturbed_at = -math.inf
        """When discovery last came back, lost our lease or stalled a keepalive."""

    @property
    def lease(self) -> int | None:
        return self._lease

    @property
    def reachable(self) -> bool:
        """False from the first failed call of the keepalive or a watch until one succeeds."""
        return self._down_since is None

    def settling(self) -> bool:
        """Unreachable now, or it came back, lost our lease or stalled a keepalive within
        the last lease TTL: deletions seen now may be leases that expired en masse, not
        processes that left."""
        return not self.reachable or time.monotonic() - self._disturbed_at < self.lease_ttl

    def _went_down(self) -> bool:
        """Note a failed call; True if discovery was reachable until now."""
        self._disturbed_at = time.monotonic()
        if self._down_since is not None:
            return False
        self._down_since = time.monotonic()
        return True

    def _came_back(self) -> None:
        if self._down_since is not None:
            log.info(
                "discovery at %s reachable again after %.1fs",
                self.store.location,
                time.monotonic() - self._down_since,
            )
            self._down_since = None
            self._disturbed_at = time.monotonic()

    async def start(self) -> Discovery:
        """Grant the lease (retrying up to ``connect_timeout``) and start keeping it alive."""
        await self._retry(self._grant, "grant a lease")
        self._keepalive = asyncio.create_task(self._keepalive_loop(), name="discovery-keepalive")
        return self

    async def close(self, revoke: bool = True) -> None:
        """Stop the keepalive; with ``revoke`` every registered key disappears now."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if revoke and self._lease is not None:
            try:
                await asyncio.wait_for(self.store.revoke(self._lease), 2.0)
            except (DiscoveryError, asyncio.TimeoutError) as exc:
                log.warning(
                    "could not revoke lease at %s (%s): keys expire within %.0fs",
                    self.store.location,
                    exc,
                    self.lease_ttl,
                )
        self._lease = None
        await self.store.close()

    async def __aenter__(self) -> Discovery:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- registration -------------------------------------------------------------

    async def register(self, key: str, value: bytes) -> None:
        """Write ``key`` under this process's lease; rewritten after any lease loss.

        Retries while the store is unreachable, up to ``connect_timeout``.
        """
        if self._keepalive is None:
            raise RuntimeError("Discovery.start() must run before register()")
        self._registered[key] = value

        async def put() -> None:
            async with self._lock:
                assert self._lease is not None
                try:
                    await self.store.put(key, value, self._lease)
                except LeaseNotFound:
                    await self._recover("a put found the lease gone")

        await self._retry(put, f"register {key}")

    async def unregister(self, key: str) -> None:
        self._registered.pop(key, None)
        await self._retry(lambda: self.store.delete(key), f"unregister {key}")

    async def get(self, key: str) -> bytes | None:
        return await self.store.get(key)

    async def list(self, prefix: str) -> dict[str, bytes]:
        return (await self.store.list(prefix)).items

    async def put(self, key: str, value: bytes) -> None:
        """Write a key that outlives this process (no lease): supervisor state only."""
        await self.store.put(key, value)

    async def delete(self, key: str) -> bool:
        return await self.store.delete(key)

    # -- watching -----------------------------------------------------------------

    def watch(
        self,
        prefix: str,
        initial: bool = True,
        *,
        hold: bool = False,
        alive: AliveCheck | None = None,
        hold_for: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under ``prefix``, forever; with ``initial``, current keys first.

        Outages and compaction are healed by re-listing: the consumer then receives the
        difference (PUT for new or changed keys, DELETE for vanished ones), so its view
        converges on the store's without ever seeing a gap. With ``hold``, deletions seen
        while discovery is settling are held back for up to ``hold_for`` seconds (default:
        the lease TTL), until the key is written again or ``alive(key)`` says it is gone
        (:mod:`dynamoctl.discovery.hold`).
        """
        events = self._healed_watch(prefix, initial)
        if not hold:
            return events
        return hold_deletes(events, self.settling, hold_for or self.lease_ttl, alive)

    async def _healed_watch(self, prefix: str, initial: bool) -> AsyncGenerator[WatchEvent, None]:
        known: dict[str, bytes] = {}
        first = True
        backoff = Backoff(base=0.1, cap=max(0.5, self.lease_ttl / 3))
        quiet = False  # logged this outage already: later retries at debug
        while True:
            try:
                listing = await self.store.list(prefix)
            except BaseException as exc:
                if not _survivable(exc):
                    raise
                self._went_down()
                log.log(logging.DEBUG if quiet else logging.WARNING,
                        "watch %s: %s; retrying", prefix, _describe(exc))  # fmt: skip
                quiet = True
                await asyncio.sleep(backoff.next())
                continue
            if quiet:
                log.info("watch %s: re-listed after an interruption", prefix)
            quiet = False
            for key in sorted(known.keys() - listing.items.keys()):
                yield WatchEvent(EventKind.DELETE, key)
            for key, value in listing.items.items():
                if (initial or not first) and known.get(key) != value:
                    yield WatchEvent(EventKind.PUT, key, value)
            known, first = dict(listing.items), False
            raise_if_cancel_requested()  # before waiting on a fresh watch for good
            try:
                async for event in self.store.watch(prefix, listing.revision):
                    backoff.reset()
                    if event.kind is EventKind.DELETE:
                        if known.pop(event.key, None) is None:
                            continue  # delete of a key we never saw: nothing to report
                    else:
                        assert event.value is not None
                        known[event.key] = event.value
                    yield event
            except BaseException as exc:
                if not _survivable(exc):
                    raise
                if not isinstance(exc, WatchCompacted):
                    self._went_down()
                log.warning("watch %s interrupted (%s); re-listing", prefix, _describe(exc))
                quiet = True
                await asyncio.sleep(backoff.next())

    # -- lease upkeep ---------------------------------------------------------------

    async def _grant(self) -> None:
        self._lease = await self.store.grant(self.lease_ttl)
        self.lease_epoch += 1

    async def _recover(self, why: str) -> None:
        """Grant a new lease and rewrite every registered key (caller holds the lock)."""
        log.warning(
            "discovery lease lost (%s); re-registering %d key(s) at %s",
            why,
            len(self._registered),
            self.store.location,
        )
        self._dirty = True
        self._disturbed_at = time.monotonic()  # the others' leases may have gone too
        await self._grant()
        await self._rewrite()

    async def _rewrite(self) -> None:
        assert self._lease is not None
        for key, value in list(self._registered.items()):
            await self.store.put(key, value, self._lease)
        self._dirty = False

    async def _keepalive_loop(self) -> None:
        interval = self.lease_ttl / 3
        backoff = Backoff(base=0.1, cap=interval)
        delay = interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self._keep_lease(interval)
            except BaseException as exc:
                if not _survivable(exc):
                    raise
                if self._went_down():
                    log.warning(
                        "%s; registrations expire after %.0fs without it, retrying",
                        _describe(exc),
                        self.lease_ttl,
                    )
                self._dirty = True  # the store may come back empty (a wiped etcd)
                delay = backoff.next()
                continue
            self._came_back()
            backoff.reset()
            delay = interval

    async def _keep_lease(self, interval: float) -> None:
        """One keepalive: refresh the lease, or replace it and rewrite every key."""
        started = time.monotonic()
        async with self._lock:
            assert self._lease is not None
            if not await self.store.keepalive(self._lease):
                await self._recover("keepalive found it expired")
            elif self._dirty:
                await self._rewrite()
        if time.monotonic() - started > interval:
            # A store that stalled this long may have let other leases expire (a frozen
            # etcd answers on resume, then expires every lease it kept).
            self._disturbed_at = time.monotonic()

    async def _retry(self, op: Callable[[], Awaitable[T]], what: str) -> T:
        """Run ``op`` until it stops raising StoreUnavailable or ``connect_timeout`` passes."""
        deadline = time.monotonic() + self.connect_timeout
        backoff = Backoff(base=0.1, cap=2.0)
        attempt = 0
        while True:
            attempt += 1
            try:
                return await op()
            except (StoreUnavailable, asyncio.CancelledError) as exc:
                if not _survivable(exc):
                    raise
                self._went_down()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DiscoveryUnavailable(
                        f"could not {what}: {self.store.backend} discovery at "
                        f"{self.store.location} unreachable for {self.connect_timeout:.0f}s "
                        f"({_describe(exc)}). Is it running, and are the recipe's discovery "
                        "settings right?"
                    ) from exc
                log.warning(
                    "could not %s (attempt %d): %s; retrying, giving up in %.0fs",
                    what,
                    attempt,
                    _describe(exc),
                    left,
                )
                await asyncio.sleep(min(backoff.next(), left))


def _survivable(exc: BaseException) -> bool:
    """Whether a background task carries on after ``exc``: any error, and a
    ``CancelledError`` that is not a cancellation of the current task (a gRPC call
    cancelled under it); never a real cancellation, ``KeyboardInterrupt`` or exit."""
    if isinstance(exc, Exception):
        return True
    if isinstance(exc, asyncio.CancelledError):
        cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11+
        return cancelling is not None and cancelling() == 0
    return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, DiscoveryError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
