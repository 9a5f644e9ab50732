"""etcd discovery through ``aetcd`` (asyncio gRPC client; why this client: docs/discovery.md).

Several endpoints may be given: the store talks to one and moves to the next when it
cannot be reached, so one dead member of a three-member cluster costs one retry, not an
outage. Every transport failure surfaces as :class:`StoreUnavailable`; retrying is the
caller's job (:mod:`dynamoctl.discovery.client` does it for leases and watches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
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


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http://host:2379`` (or bare ``host:port``) → ``(host, port)``."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme == "https":
        raise ValueError(f"TLS etcd endpoints are not supported yet, got {endpoint!r}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"etcd endpoint must look like http://HOST:PORT, got {endpoint!r}")
    return parts.hostname, parts.port or 2379


class EtcdStore(Store):
    """A :class:`Store` backed by an etcd 3.x cluster."""

    backend = "etcd"

    def __init__(self, endpoints: list[str], request_timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd discovery needs at least one endpoint")
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self._timeout = request_timeout
        self._current = 0
        self._client: aetcd.Client | None = None

    @property
    def location(self) -> str:
        host, port = self._endpoints[self._current]
        return f"http://{host}:{port}"

    def _connection(self) -> aetcd.Client:
        if self._client is None:
            host, port = self._endpoints[self._current]
            self._client = aetcd.Client(
                host=host, port=port, timeout=self._timeout, options=dict(_GRPC_OPTIONS)
            )
        return self._client

    async def _failover(self) -> None:
        """Drop the connection and move to the next endpoint (if there is one)."""
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)
        if len(self._endpoints) > 1:
            self._current = (self._current + 1) % len(self._endpoints)
            log.info("etcd: trying next endpoint %s", self.location)

    async def _call(self, op: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        try:
            return await bounded(op(self._connection()), self._timeout * 2)
        except _TRANSIENT as exc:
            where = self.location
            await self._failover()
            raise StoreUnavailable(f"etcd at {where} unreachable: {_brief(exc)}") from exc
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" in str(exc):
                raise LeaseNotFound(str(exc)) from exc
            raise

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

    async def delete(self, key: str) -> bool:
        reply = await self._call(lambda c: c.delete(key.encode()))
        return bool(reply.deleted)

    async def get(self, key: str) -> bytes | None:
        reply = await self._call(lambda c: c.get(key.encode()))
        return bytes(reply.value) if reply is not None else None

    async def list(self, prefix: str) -> Listing:
        reply = await self._call(lambda c: c.get_prefix(prefix.encode()))
        items = {bytes(kv.key).decode(): bytes(kv.value) for kv in reply}
        return Listing(items, int(reply.header.revision))

    async def watch(self, prefix: str, after: int) -> AsyncIterator[WatchEvent]:
        watch = await self._call(
            lambda c: c.watch_prefix(prefix.encode(), start_revision=after + 1)
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
        except (*_TRANSIENT, aetcd.exceptions.ClientError) as exc:
            where = self.location
            await self._failover()
            raise StoreUnavailable(f"etcd watch at {where} broke: {_brief(exc)}") from exc
        finally:
            # A watch abandoned mid-stream (consumer closed or cancelled) must not leak.
            await _cancel_quietly(watch)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)


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


def _forget(task: asyncio.Task[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its failure was expected and is not worth a warning
