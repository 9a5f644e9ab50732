"""Discovery backends by name, and the one-string form processes pass each other.

A discovery URL is what the supervisor hands every component on its command line:
``embedded`` / ``embedded:///run/dir``, ``etcd://host:2379,host2:2379``, or
``etcd+https://host:2379`` for an etcd served over TLS. The URL never carries key
material: a TLS client reads its CA, certificate and key from the environment
(:class:`~dynamoctl.discovery.etcd_tls.EtcdTls`), or is handed them (the supervisor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from dynamoctl.discovery.api import Store
from dynamoctl.discovery.embedded import EmbeddedStore

if TYPE_CHECKING:
    from dynamoctl.discovery.etcd_tls import EtcdTls


def _embedded(rest: str, tls: EtcdTls | None) -> Store:
    return EmbeddedStore(rest or None)


def _endpoints(rest: str, scheme: str) -> list[str]:
    endpoints = [e for e in rest.split(",") if e]
    if not endpoints:
        raise ValueError(
            "etcd discovery URL needs endpoints: etcd[+https]://HOST:PORT[,HOST:PORT...]"
        )
    return [f"{scheme}://{e}" for e in endpoints]


# The etcd client (aetcd, gRPC, protobuf: ~0.1 s) is imported by the backends that use it,
# so that a process on embedded discovery, and every CLI command, starts without it.


def _etcd(rest: str, tls: EtcdTls | None) -> Store:
    from dynamoctl.discovery.etcd import EtcdStore

    return EtcdStore(_endpoints(rest, "http"))


def _etcd_tls(rest: str, tls: EtcdTls | None) -> Store:
    from dynamoctl.discovery.etcd import EtcdStore

    return EtcdStore(_endpoints(rest, "https"), tls=tls)


BACKENDS: dict[str, Callable[[str, EtcdTls | None], Store]] = {
    "embedded": _embedded,
    "etcd": _etcd,
    "etcd+https": _etcd_tls,
}
"""Backend name → factory taking the URL's location part (and TLS material, if given)."""


def store_from_url(url: str, tls: EtcdTls | None = None) -> Store:
    """Build a :class:`Store` from ``embedded[://PATH]`` or ``etcd[+https]://HOST:PORT[,...]``.

    ``tls`` is for ``etcd+https``; without it the material comes from the environment."""
    scheme = urlsplit(url).scheme if "://" in url else url
    factory = BACKENDS.get(scheme)
    if factory is None:
        valid = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown discovery backend {scheme!r} in {url!r}; valid: {valid}")
    return factory(url.partition("://")[2], tls)


def etcd_url(endpoints: list[str]) -> str:
    """The discovery URL of etcd client URLs (``http://`` or ``https://``, not mixed)."""
    secure = endpoints[0].startswith("https://")
    hosts = ",".join(e.split("://", 1)[1] for e in endpoints)
    return f"{'etcd+https' if secure else 'etcd'}://{hosts}"
