"""Discovery backends by name, and the one-string form processes pass each other.

A discovery URL is what the supervisor hands every component on its command line:
``embedded`` / ``embedded:///run/dir`` or ``etcd://host:2379,host2:2379``.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from dynamoctl.discovery.api import Store
from dynamoctl.discovery.embedded import EmbeddedStore
from dynamoctl.discovery.etcd import EtcdStore


def _embedded(rest: str) -> Store:
    return EmbeddedStore(rest or None)


def _etcd(rest: str) -> Store:
    endpoints = [e for e in rest.split(",") if e]
    if not endpoints:
        raise ValueError("etcd discovery URL needs endpoints: etcd://HOST:PORT[,HOST:PORT...]")
    return EtcdStore([f"http://{e}" for e in endpoints])


BACKENDS: dict[str, Callable[[str], Store]] = {"embedded": _embedded, "etcd": _etcd}
"""Backend name → factory taking the URL's location part."""


def store_from_url(url: str) -> Store:
    """Build a :class:`Store` from ``embedded[://PATH]`` or ``etcd://HOST:PORT[,...]``."""
    scheme = urlsplit(url).scheme if "://" in url else url
    factory = BACKENDS.get(scheme)
    if factory is None:
        valid = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown discovery backend {scheme!r} in {url!r}; valid: {valid}")
    return factory(url.partition("://")[2])
