"""A recipe's ``discovery`` section: how a deployment's processes find each other,
``embedded`` on one host or a real etcd."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from dynamoctl.recipe.fields import (
    LocalPath,
    NonEmptyStr,
    RecipeModel,
    check_etcd_endpoint,
    rule_error,
)
from dynamoctl.recipe.security import SecretSource


class _Discovery(RecipeModel):
    backend: str
    """Discovery backend; every process registers itself there under a lease."""
    lease_ttl: float = Field(default=10.0, ge=2, le=3600)
    """Seconds a registration outlives its process's last heartbeat. A process that loses its
    lease re-acquires it and registers again; it does not exit. At most an hour: requests
    would go to a dead process for that long."""


class EmbeddedDiscovery(_Discovery):
    """Discovery without a server, for a deployment on a single host."""

    backend: Literal["embedded"]
    """``embedded``: same API and lease semantics as etcd, nothing to install."""
    path: LocalPath | None = None
    """State directory. Default: a per-user run directory chosen by dynamoctl."""


class EtcdDiscovery(_Discovery):
    """A real etcd 3.x server: needed as soon as components run on more than one host."""

    backend: Literal["etcd"]
    """``etcd``: an etcd 3.x cluster, external or started by dynamoctl."""
    endpoints: list[Annotated[str, AfterValidator(check_etcd_endpoint)]] = Field(
        default_factory=list
    )
    """Client URLs of an external etcd, e.g. ``http://10.0.0.1:2379``, or
    ``https://etcd1:2379`` for one served over TLS (all ``https`` or none). Required unless
    ``managed``."""
    managed: bool = False
    """dynamoctl starts etcd on the head node, owns it, and stops it on ``dynamoctl down``
    (over TLS with its own certificates on ssh and slurm targets: ``security.etcd_tls``)."""
    allow_plaintext: bool = False
    """Accept ``http://`` endpoints (an external etcd without TLS) on a target that spans
    several hosts: its traffic (every record, the deployment's addresses) crosses the
    network in clear and anyone who reaches it can rewrite discovery. ``up`` refuses such a
    recipe unless it says this."""
    ca_file: LocalPath | None = None
    """``https`` endpoints: PEM file of the CA that signed the etcd servers' certificates,
    on the supervisor's host. Default: the system's trusted CAs."""
    cert_file: LocalPath | None = None
    """``https`` endpoints: PEM client certificate, for an etcd that requires one
    (``--client-cert-auth``); with ``key_file``."""
    key_file: LocalPath | None = None
    """PEM private key of ``cert_file``."""
    username: NonEmptyStr | None = None
    """``https`` endpoints: etcd user, for an etcd with authentication enabled; with
    ``password``."""
    password: SecretSource | None = None
    """Where that user's password is read, e.g. ``{from_env: ETCD_PASSWORD}``."""

    @model_validator(mode="after")
    def _tls_settings(self) -> EtcdDiscovery:
        tls_fields = ("ca_file", "cert_file", "key_file", "username", "password")
        given = [name for name in tls_fields if getattr(self, name) is not None]
        secure = bool(self.endpoints) and all(e.startswith("https://") for e in self.endpoints)
        if given and not secure:
            raise rule_error(given[0], "applies to https:// endpoints only")
        if any(e.startswith("https://") for e in self.endpoints) and not secure:
            raise rule_error("endpoints", "must be all https:// or all http://")
        if (self.cert_file is None) != (self.key_file is None):
            raise rule_error("cert_file" if self.key_file else "key_file", "needs the other")
        if (self.username is None) != (self.password is None):
            raise rule_error("password" if self.username else "username", "needs the other")
        return self

    @model_validator(mode="after")
    def _endpoints_or_managed(self) -> EtcdDiscovery:
        if self.managed and self.endpoints:
            raise rule_error(
                "endpoints", "must be empty with managed: true (dynamoctl picks the address)"
            )
        if not self.managed and not self.endpoints:
            raise rule_error(
                "endpoints", "required unless managed: true (e.g. [http://10.0.0.1:2379])"
            )
        return self


Discovery = Annotated[EmbeddedDiscovery | EtcdDiscovery, Field(discriminator="backend")]
