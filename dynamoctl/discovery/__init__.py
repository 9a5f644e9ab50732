"""Discovery: every process registers itself under a lease; others list and watch.

Backends (``embedded``: a SQLite file on one host; ``etcd``: a real etcd cluster) share
one small :class:`Store` interface; :class:`Discovery` adds lease upkeep, re-registration
and outage-proof watches on top, identically for both.
"""

from dynamoctl.discovery.api import (
    DiscoveryError,
    EventKind,
    LeaseNotFound,
    Listing,
    Store,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
)
from dynamoctl.discovery.client import Discovery, DiscoveryUnavailable
from dynamoctl.discovery.registry import BACKENDS, store_from_url

__all__ = [
    "BACKENDS",
    "Discovery",
    "DiscoveryError",
    "DiscoveryUnavailable",
    "EventKind",
    "LeaseNotFound",
    "Listing",
    "Store",
    "StoreUnavailable",
    "WatchCompacted",
    "WatchEvent",
    "store_from_url",
]
