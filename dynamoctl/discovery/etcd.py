"""etcd discovery through ``aetcd`` (asyncio gRPC client; why this client: docs/discovery.md).

Several endpoints may be given: the store talks to one and moves to the next when it
cannot be reached, so one dead member of a three-member cluster costs one retry, not an
outage. Every transport failure surfaces as :class:`StoreUnavailable`; retrying is the
caller's job (:mod:`dynamoctl.discovery.client` does it for leases and watches).

A connection is shared by every call of the process (keepalive, watches, probes): it is
never closed under calls still using it. Moving to another endpoint retires the old
connection, which is closed once its last call ends; with one endpoint the connection is
kept and gRPC reconnects by itself. A gRPC call cancelled under us (not by a cancellation
of the calling task) is a :class:`StoreUnavailable` too: a ``CancelledError`` that escapes
would end whichever background task made the call (docs/discovery.md, "Outages").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions

from dynamoctl.discovery.api import (
    EventKind,
    LeaseNotFound,
    Listing,
    Store,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
)
from dynamoctl.discovery.etcd_secure import SecureClient
from dynamoctl.discovery.etcd_tls import EtcdTls
from dynamoctl.util.aio import bounded, raise_if_cancel_requested

log = logging.getLogger(__name__)
T = TypeVar("T")

# gRPC waits up to 120 s between reconnect attempts by default; a restarted etcd must be
# noticed within a lease TTL, so cap the wait at half a second.
_GRPC_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 500,
}
_TRANSIENT = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    asyncio.TimeoutError,
    OSError,
)
_REFUSALS = (
    aetcd.exceptions.InvalidArgumentError,
    aetcd.exceptions.PreconditionFailedError,
    aetcd.exceptions.UnauthenticatedError,
)
"""Client errors that are etcd's answer, not a broken transport: raised as they are."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http[s]://host:2379`` (or bare ``host:port``) → ``(host, port)``."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint must look like http[s]://HOST:PORT, got {endpoint!r}")
    return parts.hostname, parts.port or 2379


def _uses_tls(endpoints: list[str]) -> bool:
    """Whether the endpoints are ``https://`` (all of them, or none: no downgrade)."""
    secure = {e.startswith("https://") for e in endpoints}
    if len(secure) > 1:
        raise ValueError("etcd endpoints must be all https:// or all http://, not a mix")
    return secure == {True}


class EtcdStore(Store):
    """A :class:`Store` backed by an etcd 3.x cluster."""

    backend = "etcd"

    def __init__(
        self, endpoints: list[str], request_timeout: float = 2.0, tls: EtcdTls | None = None
    ) -> None:
        """``https://`` endpoints use ``tls``, by default :meth:`EtcdTls.from_env`."""
        if not endpoints:
            raise ValueError("etcd discovery needs at least one endpoint")
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self._tls = (tls or EtcdTls.from_env()) if _uses_tls(endpoints) else None
        self._timeout = request_timeout
        self._current = 0
        self._client: aetcd.Client | None = None
        self._calls: dict[aetcd.Client, int] = {}
        """Calls (watches included) using each connection right now."""
        self._retired: set[aetcd.Client] = set()
        """Connections replaced by a failover, closed once no call uses them."""

    @property
    def location(self) -> str:
        host, port = self._endpoints[self._current]
        return f"{'https' if self._tls else 'http'}://{host}:{port}"

    def _connection(self) -> aetcd.Client:
        if self._client is None:
            host, port = self._endpoints[self._current]
            where: dict[str, Any] = {"host": host, "port": port, "timeout": self._timeout}
            options = dict(_GRPC_OPTIONS)
            if self._tls is None:
                self._client = aetcd.Client(**where, options=options)
            else:
                self._client = SecureClient(tls=self._tls, **where, options=options)
        return self._client

    def _failover(self) -> None:
        """Move to the next endpoint, if there is one; the old connection is retired, not
        closed: other calls may still be using it (closing it would cancel them)."""
        if len(self._endpoints) < 2:
            return  # gRPC reconnects the one channel by itself (backoff capped at 0.5 s)
        self._retire(self._client)
        self._current = (self._current + 1) % len(self._endpoints)
        log.info("etcd: trying next endpoint %s", self.location)

    def _retire(self, client: aetcd.Client | None) -> None:
        """Stop handing ``client`` out; close it once no call uses it."""
        if client is not None and client is self._client:
            self._client = None
            self._retired.add(client)
            self._close_if_unused(client)

    @contextlib.contextmanager
    def _using(self) -> Iterator[aetcd.Client]:
        """The current connection, counted as in use until the block ends."""
        client = self._connection()
        self._calls[client] = self._calls.get(client, 0) + 1
        try:
            yield client
        finally:
            self._calls[client] -= 1
            self._close_if_unused(client)

    def _close_if_unused(self, client: aetcd.Client) -> None:
        if client in self._retired and not self._calls.get(client):
            self._retired.discard(client)
            self._calls.pop(client, None)
            _in_background(_close_quietly(client))

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailable:
        """``exc`` as a :class:`StoreUnavailable`, after a failover."""
        where = self.location
        self._failover()
        return StoreUnavailable(f"etcd at {where} {what}: {_brief(exc)}")

    async def _call(self, op: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        try:
            with self._using() as client:
                return await self._call_on(client, op)
        except aetcd.exceptions.UnauthenticatedError as exc:
            if not _token_expired(exc):
                raise
            # etcd's auth tokens expire when unused (--auth-token-ttl) and all vanish
            # when etcd restarts; aetcd authenticates only when it connects, so a new
            # connection is a new token. Once: a refused password is not retried.
            self._retire(client)
            log.info("etcd at %s: auth token expired; authenticating again", self.location)
            with self._using() as client:
                return await self._call_on(client, op)

    async def _call_on(self, client: aetcd.Client, op: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """``op`` on a connection the caller holds, within the request timeout; every
        failure of the transport as :class:`StoreUnavailable`."""
        try:
            return await bounded(op(client), self._timeout * 2)
        except asyncio.CancelledError as exc:
            raise_if_cancel_requested()  # ours: the caller is being cancelled
            raise self._unavailable("call cancelled", exc) from exc
        except _TRANSIENT as exc:
            raise self._unavailable("unreachable", exc) from exc
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise WatchCompacted(str(exc)) from exc
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" in str(exc):
                raise LeaseNotFound(str(exc)) from exc
            if isinstance(exc, _REFUSALS):
                raise
            # CANCELLED, UNKNOWN, a watch not created in time: codes aetcd maps to no
            # class of its own, or a timeout of its own.
            raise self._unavailable("call failed", exc) from exc

    async def grant(self, ttl: float) -> int:
        # etcd leases are whole seconds; round up so a key never dies early.
        lease = await self._call(lambda c: c.lease(max(1, int(-(-ttl // 1)))))
        return int(lease.id)

    async def keepalive(self, lease: int) -> bool:
        reply = await self._call(lambda c: c.refresh_lease(lease))
        return int(reply.TTL) > 0

    async def revoke(self, lease: int) -> None:
        with contextlib.suppress(LeaseNotFound):
            await self._call(lambda c: c.revoke_lease(lease))

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        await self._call(lambda c: c.put(key.encode(), value, lease=lease))

    async def replace(self, key: str, old: bytes | None, new: bytes) -> bool:
        name = key.encode()

        async def txn(c: aetcd.Client) -> bool:
            check = c.transactions
            compare = [check.version(name) == 0 if old is None else check.value(name) == old]
            succeeded, _ = await c.transaction(compare, [check.put(name, new)], [])
            return bool(succeeded)

        return await self._call(txn)

    async def delete(self, key: str) -> bool:
        reply = await self._call(lambda c: c.delete(key.encode()))
        return reply is not None  # aetcd answers None for a key that was not there

    async def get(self, key: str) -> bytes | None:
        reply = await self._call(lambda c: c.get(key.encode()))
        return bytes(reply.value) if reply is not None else None

    async def list(self, prefix: str) -> Listing:
        reply = await self._call(lambda c: c.get_prefix(prefix.encode()))
        items = {bytes(kv.key).decode(): bytes(kv.value) for kv in reply}
        return Listing(items, int(reply.header.revision))

    async def watch(self, prefix: str, after: int) -> AsyncIterator[WatchEvent]:
        with self._using() as client:  # the connection stays open while events flow
            watch = await self._call_on(
                client, lambda c: c.watch_prefix(prefix.encode(), start_revision=after + 1)
            )
            try:
                raise_if_cancel_requested()  # a cancel lost while gRPC set the watch up
                async for event in watch:
                    key = bytes(event.kv.key).decode()
                    if event.kind == "DELETE":
                        yield WatchEvent(EventKind.DELETE, key)
                    else:
                        yield WatchEvent(EventKind.PUT, key, bytes(event.kv.value))
            except aetcd.exceptions.RevisionCompactedError as exc:
                raise WatchCompacted(f"etcd compacted revision {after}") from exc
            except asyncio.CancelledError as exc:
                raise_if_cancel_requested()
                raise self._unavailable("watch cancelled", exc) from exc
            except (*_TRANSIENT, aetcd.exceptions.ClientError) as exc:
                raise self._unavailable("watch broke", exc) from exc
            finally:
                # A watch abandoned mid-stream (consumer closed or cancelled) must not leak.
                await _cancel_quietly(watch)

    async def close(self) -> None:
        client, self._client = self._client, None
        retired, self._retired = self._retired, set()
        self._calls.clear()
        for old in [*retired, *([client] if client is not None else [])]:
            await _close_quietly(old)


def _token_expired(exc: BaseException) -> bool:
    return "invalid auth token" in str(exc) or "auth token is expired" in str(exc)


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


# Shutdown must never wait on a dead etcd: closing a channel or cancelling a watch whose
# stream broke can otherwise block indefinitely inside gRPC.
_CLOSE_TIMEOUT = 2.0


async def _close_quietly(client: aetcd.Client) -> None:
    await _within_close_timeout(client.close(), "closing client")


async def _cancel_quietly(watch: Any) -> None:
    await _within_close_timeout(watch.cancel(), "cancelling watch")


_ABANDONED: set[asyncio.Task[Any]] = set()
"""Cleanup calls still running past their bound (referenced so they are not collected)."""


async def _within_close_timeout(call: Awaitable[Any], what: str) -> None:
    """Run ``call`` for at most ``_CLOSE_TIMEOUT`` seconds, then leave it behind.

    Not ``wait_for``: on timeout it cancels the call and then waits for it to end, and a
    gRPC call on a broken channel can ignore that cancellation (seen after an etcd restart:
    cancelling a discovery watch then hung its task until cancelled a second time)."""
    task: asyncio.Task[Any] = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT)
    except asyncio.CancelledError:
        _abandon(task)
        raise
    if not done:
        log.debug("etcd: %s took more than %.0fs; leaving it behind", what, _CLOSE_TIMEOUT)
        _abandon(task)
    elif not task.cancelled() and task.exception() is not None:
        log.debug("etcd: error %s", what, exc_info=task.exception())


def _abandon(task: asyncio.Task[Any]) -> None:
    task.cancel()
    _ABANDONED.add(task)
    task.add_done_callback(_forget)


def _in_background(call: Awaitable[Any]) -> None:
    """Run ``call`` without waiting for it (a retired connection's close)."""
    task: asyncio.Task[Any] = asyncio.ensure_future(call)
    _ABANDONED.add(task)
    task.add_done_callback(_forget)


def _forget(task: asyncio.Task[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its failure was expected and is not worth a warning
