"""A deployment's key material: made once in its private run directory, handed to its
instances as secrets by reference (docs/security.md, "Key material").

``RUN/keys/`` (mode 0700, files 0600) holds the planes' CURVE secret key and the managed
etcd's CA (with its key, to re-issue the server certificate when the head node changes),
server certificate and the one client certificate every component presents. A new
``dynamoctl up`` of the same deployment reuses them, so a restarted supervisor's instances
and the ones it adopts still speak to each other. The plan references these files
(``InstanceSpec.secrets``); only the launchers read them, right before a start.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from dynamoctl.discovery.etcd_tls import EtcdTls
from dynamoctl.launch.api import SecretRef
from dynamoctl.plan.hosts import Host
from dynamoctl.planes.curve import generate_secret
from dynamoctl.recipe.discovery import EtcdDiscovery
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.security import SecretSource
from dynamoctl.recipe.targets import LocalTarget
from dynamoctl.security import names, pki

KEYS_DIR = "keys"


@dataclass(frozen=True)
class KeyFiles:
    """Where a deployment's key material lives (on the supervisor's host)."""

    root: Path

    @property
    def curve(self) -> Path:
        return self.root / "planes.key"

    @property
    def ca(self) -> Path:
        return self.root / "etcd-ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "etcd-ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "etcd-server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "etcd-server.key"

    @property
    def client_cert(self) -> Path:
        return self.root / "etcd-client.pem"

    @property
    def client_key(self) -> Path:
        return self.root / "etcd-client.key"

    @property
    def control_token(self) -> Path:
        return self.root / "control.token"


def key_files(run_dir: Path) -> KeyFiles:
    return KeyFiles(run_dir / KEYS_DIR)


def networked(recipe: Recipe) -> bool:
    """Whether components listen on a network address others can reach (ssh, slurm)."""
    return not isinstance(recipe.target, LocalTarget)


def curve_on(recipe: Recipe) -> bool:
    wanted = recipe.security.curve
    return networked(recipe) if wanted is None else wanted


def managed_etcd_tls(recipe: Recipe) -> bool:
    disc = recipe.discovery
    if not isinstance(disc, EtcdDiscovery) or not disc.managed:
        return False
    wanted = recipe.security.etcd_tls
    return networked(recipe) if wanted is None else wanted


def external_etcd_tls(recipe: Recipe) -> EtcdDiscovery | None:
    """The recipe's external etcd, when it is served over ``https://``."""
    disc = recipe.discovery
    if isinstance(disc, EtcdDiscovery) and disc.endpoints[:1] and not disc.managed:
        return disc if disc.endpoints[0].startswith("https://") else None
    return None


def secret_ref(source: SecretSource) -> SecretRef:
    if source.from_env is not None:
        return SecretRef(env=source.from_env)
    return SecretRef(file=str(source.from_file))


def component_secrets(recipe: Recipe, run_dir: Path) -> dict[str, SecretRef]:
    """What every worker, router and frontend receives: the planes' key, and what it
    needs to reach a TLS etcd."""
    files = key_files(run_dir)
    out: dict[str, SecretRef] = {}
    if curve_on(recipe):
        out[names.CURVE_SECRET_KEY] = SecretRef(file=str(files.curve))
    if managed_etcd_tls(recipe):
        out[names.ETCD_CA] = SecretRef(file=str(files.ca))
        out[names.ETCD_CERT] = SecretRef(file=str(files.client_cert))
        out[names.ETCD_KEY] = SecretRef(file=str(files.client_key))
    external = external_etcd_tls(recipe)
    if external is not None:
        for variable, path in (
            (names.ETCD_CA, external.ca_file),
            (names.ETCD_CERT, external.cert_file),
            (names.ETCD_KEY, external.key_file),
        ):
            if path is not None:
                out[variable] = SecretRef(file=str(path))
        if external.password is not None:
            out[names.ETCD_PASSWORD] = secret_ref(external.password)
    return out


def component_env(recipe: Recipe) -> dict[str, str]:
    """What components are told in the clear about discovery (an etcd user's name)."""
    external = external_etcd_tls(recipe)
    if external is not None and external.username is not None:
        return {names.ETCD_USERNAME: external.username}
    return {}


def etcd_secrets(run_dir: Path) -> dict[str, SecretRef]:
    """What a managed etcd with TLS receives: the CA, its certificate and its key."""
    files = key_files(run_dir)
    return {
        names.ETCD_CA: SecretRef(file=str(files.ca)),
        names.ETCD_SERVER_CERT: SecretRef(file=str(files.server_cert)),
        names.ETCD_SERVER_KEY: SecretRef(file=str(files.server_key)),
    }


def supervisor_etcd_tls(recipe: Recipe, run_dir: Path) -> EtcdTls | None:
    """The supervisor's own TLS material for discovery (its probes, its registration)."""
    if managed_etcd_tls(recipe):
        files = key_files(run_dir)
        return EtcdTls.from_files(files.ca, files.client_cert, files.client_key)
    external = external_etcd_tls(recipe)
    if external is None:
        return None
    password = secret_ref(external.password).read("password") if external.password else None
    tls = EtcdTls.from_files(external.ca_file, external.cert_file, external.key_file)
    return EtcdTls(tls.ca, tls.cert, tls.key, external.username, password)


def use_for_discovery(recipe: Recipe, run_dir: Path) -> None:
    """Give this process (the supervisor) the etcd TLS material components get, in the
    same variables: every discovery connection it opens (probes, withdrawals, its control
    registration, adoption) then reads them, as components do. Nothing else: the planes'
    key stays out of its environment, which local instances inherit."""
    tls = supervisor_etcd_tls(recipe, run_dir)
    if tls is None:
        return
    values = {
        names.ETCD_CA: tls.ca,
        names.ETCD_CERT: tls.cert,
        names.ETCD_KEY: tls.key,
        names.ETCD_USERNAME: tls.username,
        names.ETCD_PASSWORD: tls.password,
    }
    for variable, value in values.items():
        if value:
            os.environ[variable] = value.decode() if isinstance(value, bytes) else value


def ensure(recipe: Recipe, run_dir: Path, head: Host) -> None:
    """Make whatever key material the recipe needs and ``RUN/keys`` lacks (before any
    instance starts); re-issue the etcd server certificate if the head node changed."""
    files = key_files(run_dir)
    if not (curve_on(recipe) or managed_etcd_tls(recipe)):
        return
    files.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    files.root.chmod(0o700)
    if curve_on(recipe) and not files.curve.exists():
        _write(files.curve, generate_secret().encode())
    if not managed_etcd_tls(recipe):
        return
    if not files.ca.exists() or not files.ca_key.exists():
        ca = pki.new_ca(recipe.name)
        _write(files.ca, ca.cert)
        _write(files.ca_key, ca.key)
        files.server_cert.unlink(missing_ok=True)
        files.client_cert.unlink(missing_ok=True)
    ca = pki.Issued(files.ca.read_bytes(), files.ca_key.read_bytes())
    hosts = (head.name, head.address, "localhost", "127.0.0.1")
    if not _covers(files.server_cert, hosts):
        server = pki.issue(ca, f"etcd {recipe.name}", hosts=hosts, server=True, client=True)
        _write(files.server_key, server.key)
        _write(files.server_cert, server.cert)
    if not files.client_cert.exists() or not files.client_key.exists():
        client = pki.issue(ca, f"{recipe.name} component", server=False, client=True)
        _write(files.client_key, client.key)
        _write(files.client_cert, client.cert)


def control_token(run_dir: Path) -> str:
    """The control endpoint's bearer token, made once per deployment in ``RUN/keys``: a
    planner that an earlier supervisor started, and a new one adopted, still holds a valid
    one (it is handed the file's content as a secret)."""
    path = key_files(run_dir).control_token
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write(path, secrets.token_urlsafe(24).encode())
    return path.read_text().strip()


def planner_secrets(run_dir: Path) -> dict[str, SecretRef]:
    """What the planner gets besides :func:`component_secrets`: the control token."""
    return {names.CONTROL_TOKEN: SecretRef(file=str(key_files(run_dir).control_token))}


def _covers(cert_file: Path, hosts: tuple[str, ...]) -> bool:
    """Whether the certificate exists and names every one of ``hosts``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    named = {str(v) for v in alt.get_values_for_type(x509.DNSName)}
    named |= {str(v) for v in alt.get_values_for_type(x509.IPAddress)}
    return all(host in named for host in hosts)


def _write(path: Path, data: bytes) -> None:
    """Owner-only from the first byte (never a moment world-readable), then renamed."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
