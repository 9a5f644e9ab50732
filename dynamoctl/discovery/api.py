"""The store interface every discovery backend implements, and the types it speaks.

A :class:`Store` is deliberately small (leases, put/get/list/delete, one compare-and-set,
watch-from-revision):
everything a process needs on top of it — a lease kept alive, keys re-registered after
lease loss, watches that survive an outage — lives once in :mod:`dynamoctl.discovery.client`,
so both backends behave the same by construction and one conformance suite covers them.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar


class DiscoveryError(Exception):
    """Base class for discovery failures."""


class StoreUnavailable(DiscoveryError):
    """The backend cannot be reached right now (transient: callers retry)."""


class LeaseNotFound(DiscoveryError):
    """A put named a lease that has expired or been revoked."""


class WatchCompacted(DiscoveryError):
    """A watch asked for history the store no longer keeps; the caller re-lists."""


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watched prefix. ``value`` is None for deletes."""

    kind: EventKind
    key: str
    value: bytes | None = None


@dataclass(frozen=True)
class Listing:
    """Keys under a prefix as of store revision ``revision`` (watch from there)."""

    items: dict[str, bytes]
    revision: int


class Store(ABC):
    """A key-value store with leases and prefix watches (etcd's model).

    Keys are ``str`` (UTF-8 in the store), values opaque ``bytes``. A key attached to a
    lease disappears when the lease expires or is revoked.
    """

    backend: ClassVar[str]
    """Registry name of the backend (``embedded``, ``etcd``)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store lives, for log lines and error messages."""

    @abstractmethod
    async def grant(self, ttl: float) -> int:
        """Create a lease that expires ``ttl`` seconds after its last keepalive."""

    @abstractmethod
    async def keepalive(self, lease: int) -> bool:
        """Refresh ``lease``; False if it no longer exists (expired or revoked)."""

    @abstractmethod
    async def revoke(self, lease: int) -> None:
        """Drop ``lease`` and every key attached to it."""

    @abstractmethod
    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        """Set ``key``; attached to ``lease`` when given."""

    @abstractmethod
    async def replace(self, key: str, old: bytes | None, new: bytes) -> bool:
        """Set ``key`` (no lease) to ``new`` if its value is ``old`` now (None: the key is
        absent), atomically; False, changing nothing, if it is not (another writer was
        first: the caller reads again and retries)."""

    @abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    @abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""

    @abstractmethod
    async def list(self, prefix: str) -> Listing:
        """Every key starting with ``prefix`` and the revision they were read at."""

    @abstractmethod
    def watch(self, prefix: str, after: int) -> AsyncIterator[WatchEvent]:
        """Changes under ``prefix`` with revision > ``after``, in order, until closed.

        Raises :class:`StoreUnavailable` when the backend goes away and
        :class:`WatchCompacted` when revision ``after`` is no longer available.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections; leases are left to expire (see ``Discovery.close``)."""
