"""TLS (and etcd users) for the etcd client: a managed etcd with per-deployment
certificates, or an existing cluster served over ``https://`` (docs/discovery.md, "TLS").

This module holds the material only, without the gRPC client (``etcd_secure`` has it), so
that the supervisor and the CLI handle it without importing gRPC. Components read the PEM
material from environment variables (:mod:`dynamoctl.security.names`), never from their
command line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamoctl.security import names


@dataclass(frozen=True, repr=False)
class EtcdTls:
    """What a client needs to talk to an etcd over TLS. ``repr`` shows no material."""

    ca: bytes | None = None
    """PEM of the CA to verify the server with; None: the system's roots."""
    cert: bytes | None = None
    """PEM client certificate, for an etcd started with ``--client-cert-auth``."""
    key: bytes | None = None
    """PEM private key of ``cert``."""
    username: str | None = None
    """etcd user (``etcdctl user add``), with ``password``."""
    password: str | None = None

    def __repr__(self) -> str:
        parts = [f"ca={'yes' if self.ca else 'system'}", f"client_cert={bool(self.cert)}"]
        return f"EtcdTls({', '.join(parts)}, user={self.username!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> EtcdTls:
        """From :data:`~dynamoctl.security.names.ETCD_CA` and its siblings (PEM text)."""

        def pem(name: str) -> bytes | None:
            value = environ.get(name, "")
            return value.encode() if value else None

        tls = cls(
            ca=pem(names.ETCD_CA),
            cert=pem(names.ETCD_CERT),
            key=pem(names.ETCD_KEY),
            username=environ.get(names.ETCD_USERNAME) or None,
            password=environ.get(names.ETCD_PASSWORD) or None,
        )
        tls.check()
        return tls

    @classmethod
    def from_files(
        cls, ca: str | Path | None, cert: str | Path | None = None, key: str | Path | None = None
    ) -> EtcdTls:
        """From PEM files (the supervisor's own connections, on its host)."""

        def read(path: str | Path | None) -> bytes | None:
            return Path(path).expanduser().read_bytes() if path else None

        tls = cls(ca=read(ca), cert=read(cert), key=read(key))
        tls.check()
        return tls

    def check(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError(
                f"etcd TLS: a client certificate needs its key and the reverse "
                f"({names.ETCD_CERT} and {names.ETCD_KEY})"
            )
        if (self.username is None) != (self.password is None):
            raise ValueError(f"etcd: {names.ETCD_USERNAME} and {names.ETCD_PASSWORD} go together")

    def credentials(self) -> Any:
        import grpc  # type: ignore[import-untyped]

        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
