"""etcd over TLS with client certificates: a real etcd started with certificates made by
:mod:`dynamoctl.security.pki`; the deployment's clients work, everyone else is refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.discovery.api import StoreUnavailable
from dynamoctl.discovery.etcd import EtcdStore
from dynamoctl.discovery.etcd_server import EtcdTlsFiles, ManagedEtcd
from dynamoctl.discovery.etcd_tls import EtcdTls
from dynamoctl.security import names, pki


@dataclass
class TlsEtcd:
    server: ManagedEtcd
    files: EtcdTlsFiles
    url: str
    """Discovery URL: ``etcd+https://127.0.0.1:PORT``."""


def write_pki(directory: Path, name: str) -> EtcdTlsFiles:
    ca = pki.new_ca(name)
    server = pki.issue(ca, "etcd", hosts=("localhost", "127.0.0.1"), server=True, client=True)
    client = pki.issue(ca, "client", server=False, client=True)
    directory.mkdir(mode=0o700)
    files = {
        "ca.pem": ca.cert,
        "server.pem": server.cert,
        "server.key": server.key,
        "client.pem": client.cert,
        "client.key": client.key,
    }
    for filename, pem in files.items():
        (directory / filename).write_bytes(pem)
    return EtcdTlsFiles(
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsEtcd]:
    root = tmp_path_factory.mktemp("etcd-tls")
    files = write_pki(root / "pki", "test")
    with ManagedEtcd(data_dir=root / "data", tls=files) as server:
        assert server.endpoint.startswith("https://")
        yield TlsEtcd(server, files, f"etcd+https://127.0.0.1:{server.client_port}")


def client_tls(files: EtcdTlsFiles) -> EtcdTls:
    return EtcdTls.from_files(files.ca, files.client_cert, files.client_key)


async def test_a_client_with_the_deployment_certificate_registers_and_reads(
    tls_etcd: TlsEtcd,
) -> None:
    store = store_from_url(tls_etcd.url, tls=client_tls(tls_etcd.files))
    assert store.location.startswith("https://")
    async with Discovery(store, lease_ttl=2) as disc:
        await disc.register("tls/instances/worker/generate/w1", b"hello")
        listing = await disc.list("tls/instances/")
    assert listing == {"tls/instances/worker/generate/w1": b"hello"}


async def test_components_take_the_material_from_their_environment(
    tls_etcd: TlsEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tls_etcd.files
    assert files.client_cert is not None and files.client_key is not None
    monkeypatch.setenv(names.ETCD_CA, files.ca.read_text())
    monkeypatch.setenv(names.ETCD_CERT, files.client_cert.read_text())
    monkeypatch.setenv(names.ETCD_KEY, files.client_key.read_text())
    store = store_from_url(tls_etcd.url)
    try:
        await store.put("tls/env", b"1")
        assert await store.get("tls/env") == b"1"
    finally:
        await store.close()


@pytest.mark.parametrize(
    "who",
    ["plain HTTP", "TLS without a client certificate", "a certificate of another CA"],
)
async def test_strangers_are_refused(tls_etcd: TlsEtcd, who: str, tmp_path: Path) -> None:
    port = tls_etcd.server.client_port
    if who == "plain HTTP":
        store = store_from_url(f"etcd://127.0.0.1:{port}")
    elif who == "TLS without a client certificate":
        store = EtcdStore(
            [f"https://127.0.0.1:{port}"], tls=EtcdTls(ca=tls_etcd.files.ca.read_bytes())
        )
    else:
        other = write_pki(tmp_path / "other", "other")
        stranger = EtcdTls.from_files(tls_etcd.files.ca, other.client_cert, other.client_key)
        store = EtcdStore([f"https://127.0.0.1:{port}"], tls=stranger)
    try:
        with pytest.raises(StoreUnavailable) as refused:
            await store.put("tls/forged", b"registration")
        assert "forged" not in str(refused.value)
    finally:
        await store.close()
    check = store_from_url(tls_etcd.url, tls=client_tls(tls_etcd.files))
    try:
        assert await check.get("tls/forged") is None
    finally:
        await check.close()


def test_endpoints_are_all_tls_or_none_and_material_comes_in_pairs() -> None:
    with pytest.raises(ValueError, match="mix"):
        EtcdStore(["https://a:2379", "http://b:2379"], tls=EtcdTls())
    with pytest.raises(ValueError, match=names.ETCD_KEY):
        EtcdTls.from_env({names.ETCD_CERT: "pem"})
    assert "pem" not in repr(EtcdTls(ca=b"pem", cert=b"pem", key=b"pem"))
