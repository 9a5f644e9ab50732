"""etcd over TLS with client certificates: a real etcd started with certificates made by
:mod:`dynamoctl.security.pki`; the deployment's clients work, everyone else is refused."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aetcd.exceptions
import grpc
import pytest
from aetcd import rpc

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.discovery.api import StoreUnavailable
from dynamoctl.discovery.etcd import EtcdStore
from dynamoctl.discovery.etcd_server import EtcdTlsFiles, ManagedEtcd
from dynamoctl.discovery.etcd_tls import EtcdTls
from dynamoctl.security import names, pki
from tests.infra.ports import free_port


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


@pytest.fixture
def password_etcd(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A real etcd over TLS with etcd's own authentication on (user root, password pw) and
    tokens that expire after 1 s unused; its URL and CA."""
    files = write_pki(tmp_path / "pki", "auth")
    client, peer = free_port("127.0.0.1"), free_port("127.0.0.1")
    argv = [
        "etcd", f"--data-dir={tmp_path / 'data'}", "--auth-token-ttl=1",
        f"--listen-client-urls=https://127.0.0.1:{client}",
        f"--advertise-client-urls=https://127.0.0.1:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=default=http://127.0.0.1:{peer}",
        f"--cert-file={files.cert}", f"--key-file={files.key}",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ca = files.ca.read_bytes()
        asyncio.run(_enable_auth(f"127.0.0.1:{client}", ca))
        yield f"etcd+https://127.0.0.1:{client}", ca
    finally:
        proc.kill()
        proc.wait()


async def _enable_auth(target: str, ca: bytes) -> None:
    async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca)) as channel:
        auth = rpc.AuthStub(channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="pw"))
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, "etcd never came up"
                await asyncio.sleep(0.1)
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.AuthEnable(rpc.AuthEnableRequest())


async def test_a_password_user_outlives_its_auth_token(password_etcd: tuple[str, bytes]) -> None:
    """etcd's tokens expire when unused (and all vanish when etcd restarts): a store that
    was idle longer than the token's TTL authenticates again instead of failing for good."""
    url, ca = password_etcd
    wrong = store_from_url(url, tls=EtcdTls(ca=ca, username="root", password="nope"))
    store = store_from_url(url, tls=EtcdTls(ca=ca, username="root", password="pw"))
    try:
        with pytest.raises(aetcd.exceptions.ClientError, match="authentication failed"):
            await wrong.put("auth/forged", b"x")
        await store.put("auth/k", b"1")
        await asyncio.sleep(3)  # idle past --auth-token-ttl: etcd forgets the token
        await store.put("auth/k", b"2")
        assert await store.get("auth/k") == b"2"
    finally:
        await store.close()
        await wrong.close()
