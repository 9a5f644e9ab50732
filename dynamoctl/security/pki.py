"""A deployment's own small PKI for its managed etcd: one CA, the server's certificate and
the clients' certificate, made with ``cryptography`` (docs/security.md, "Managed etcd").

ECDSA P-256 keys (fast to make, accepted by etcd's Go TLS and by gRPC); certificates valid
for ten years: they live and die with the deployment's run directory, which is where
rotation happens (delete its ``keys/`` and start again).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True, repr=False)
class Issued:
    """A certificate and its private key, PEM. ``repr`` shows neither."""

    cert: bytes
    key: bytes

    def __repr__(self) -> str:
        return "Issued(<pem>)"


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dynamoctl"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True,
    content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, encipher_only=False, decipher_only=False,
)  # fmt: skip


def new_ca(deployment: str) -> Issued:
    """A self-signed CA for ``deployment`` only (path length 0: it signs leaves only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = _name(f"dynamoctl {deployment} CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: Issued, common_name: str, *, hosts: tuple[str, ...] = (), server: bool, client: bool
) -> Issued:
    """A leaf certificate signed by ``ca``. ``hosts`` (names and IP addresses) become its
    subject alternative names, which is what TLS clients verify a server against."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in dict.fromkeys(hosts)]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
