"""What the plan hands each instance (secrets by reference, never values), the key material
the supervisor makes, a managed etcd started from it as the plan says, and private files."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from dynamoctl.discovery import store_from_url
from dynamoctl.discovery.api import StoreUnavailable
from dynamoctl.discovery.embedded import EmbeddedStore
from dynamoctl.launch.api import SecretRef
from dynamoctl.plan.build import build_plan, render
from dynamoctl.plan.hosts import Host
from dynamoctl.recipe.loader import RecipeError, load_recipe_text
from dynamoctl.security import names
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.rundir import RunDir
from tests.infra.ports import free_port

HEAD = """\
schema: 1
name: sec
model: {name: m, path: m}
"""
WORKERS = "workers:\n  agg: {engine: mocker, gpus_per_replica: 0%s}\n"
SSH = (
    "target: {kind: ssh, hosts: [gpu-a, gpu-b], addresses: {gpu-a: 192.0.2.1, gpu-b: 192.0.2.2}}\n"
)
MANAGED = "discovery: {backend: etcd, managed: true}\n"


def recipe(*parts: str, env: str = ""):  # type: ignore[no-untyped-def]
    return load_recipe_text(HEAD + "".join(parts) + WORKERS % env, "r.yaml")


def test_pool_env_secrets_are_references_and_the_dry_run_masks_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_value_that_must_not_show")
    env = ", env: {HF_TOKEN: {from_env: HF_TOKEN}, KEY: {from_file: ~/k.txt}, LEVEL: debug}"
    plan, _ = build_plan(recipe(env=env), Path("/run"))
    worker = plan.by_pool("agg")[0]
    assert worker.env["LEVEL"] == "debug"
    assert "HF_TOKEN" not in worker.env and "KEY" not in worker.env
    assert worker.secrets["HF_TOKEN"] == SecretRef(env="HF_TOKEN")
    assert worker.secrets["KEY"] == SecretRef(file="~/k.txt")
    text = render(plan, lambda spec: spec.argv)
    assert "HF_TOKEN=<from env HF_TOKEN>" in text and "KEY=<from file ~/k.txt>" in text
    assert "hf_value_that_must_not_show" not in text


def test_a_secret_source_names_exactly_one_place() -> None:
    for bad in ("{}", "{from_env: A, from_file: /b}"):
        with pytest.raises(RecipeError, match="exactly one of from_env and from_file"):
            recipe(env=f", env: {{T: {bad}}}")


def test_networked_targets_are_locked_by_default_and_local_on_request() -> None:
    plan, _ = build_plan(recipe(SSH, MANAGED), Path("/run"))
    assert plan.discovery_url == "etcd+https://192.0.2.1:2379"
    etcd, *components = plan.instances
    assert set(etcd.secrets) == {names.ETCD_CA, names.ETCD_SERVER_CERT, names.ETCD_SERVER_KEY}
    assert etcd.argv[1:5] == [
        "-m",
        "dynamoctl.discovery.etcd_server",
        "./dynamoctl-sec-etcd-tls",
        "etcd",
    ]
    assert "--listen-client-urls=https://192.0.2.1:2379" in etcd.argv
    for spec in components:
        assert spec.secrets[names.CURVE_SECRET_KEY] == SecretRef(file="/run/keys/planes.key")
        assert spec.secrets[names.ETCD_CERT] == SecretRef(file="/run/keys/etcd-client.pem")
        assert not any("PRIVATE KEY" in arg or "/run/keys" in arg for arg in spec.argv)

    local, _ = build_plan(recipe(), Path("/run"))
    assert all(not spec.secrets for spec in local.instances)
    forced, _ = build_plan(recipe("security: {curve: true}\n"), Path("/run"))
    assert all(names.CURVE_SECRET_KEY in spec.secrets for spec in forced.instances)
    plain, _ = build_plan(
        recipe(SSH, MANAGED, "security: {curve: false, etcd_tls: false}\n"), Path("/run")
    )
    assert plain.discovery_url.startswith("etcd://")
    assert all(not spec.secrets for spec in plain.instances)


def test_an_existing_tls_etcd_is_reached_with_the_recipe_files() -> None:
    disc = (
        "discovery: {backend: etcd, endpoints: [https://e1:2379, https://e2:2379], "
        "ca_file: /pki/ca.pem, cert_file: /pki/c.pem, key_file: /pki/c.key, "
        "username: dyn, password: {from_env: ETCD_PW}}\n"
    )
    plan, _ = build_plan(recipe(disc), Path("/run"))
    assert plan.discovery_url == "etcd+https://e1:2379,e2:2379"
    worker = plan.by_pool("agg")[0]
    assert worker.secrets[names.ETCD_CA] == SecretRef(file="/pki/ca.pem")
    assert worker.secrets[names.ETCD_PASSWORD] == SecretRef(env="ETCD_PW")
    assert worker.env[names.ETCD_USERNAME] == "dyn"
    with pytest.raises(RecipeError, match="applies to https:// endpoints only"):
        recipe("discovery: {backend: etcd, endpoints: [http://e1:2379], ca_file: /ca.pem}\n")
    with pytest.raises(RecipeError, match="needs the other"):
        recipe("discovery: {backend: etcd, endpoints: [https://e1:2379], cert_file: /c.pem}\n")


def test_key_material_is_private_reused_and_reissued_for_a_new_head(tmp_path: Path) -> None:
    sec = recipe(SSH, MANAGED)
    credentials.ensure(sec, tmp_path, Host("gpu-a", "192.0.2.1"))
    keys = credentials.key_files(tmp_path)
    assert stat.S_IMODE(keys.root.stat().st_mode) == 0o700
    for path in keys.root.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    curve_key, client = keys.curve.read_bytes(), keys.client_cert.read_bytes()
    credentials.ensure(sec, tmp_path, Host("gpu-a", "192.0.2.1"))
    assert keys.curve.read_bytes() == curve_key and keys.client_cert.read_bytes() == client

    credentials.ensure(sec, tmp_path, Host("gpu-c", "192.0.2.9"))  # the head moved
    cert = x509.load_pem_x509_certificate(keys.server_cert.read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-c" in alt.get_values_for_type(x509.DNSName)
    assert keys.client_cert.read_bytes() == client  # same CA: components keep working


def test_the_planned_managed_etcd_serves_tls_to_the_deployment_only(tmp_path: Path) -> None:
    """The etcd instance as planned (wrapper, flags, secrets), on free ports."""
    sec = recipe(MANAGED, "security: {etcd_tls: true}\n")
    plan, _ = build_plan(sec, tmp_path)
    credentials.ensure(sec, tmp_path, plan.hosts[0])
    etcd = plan.by_pool("etcd")[0]
    client, peer = free_port(), free_port()
    argv = [a.replace(":2379", f":{client}").replace(":2380", f":{peer}") for a in etcd.argv]
    env = {**os.environ, **{k: ref.read(k) for k, ref in etcd.secrets.items()}}
    with open(tmp_path / "etcd.log", "wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"etcd+https://127.0.0.1:{client}"
        tls = credentials.supervisor_etcd_tls(sec, tmp_path)
        assert asyncio.run(_until_served(url, tls, proc)) == b"ok"
        with pytest.raises(StoreUnavailable):
            asyncio.run(_put_get(f"etcd://127.0.0.1:{client}", None))
        tls_dir = Path(argv[3])
        assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
        assert {p.name for p in tls_dir.iterdir()} == {"ca.pem", "server.pem", "server.key"}
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert b"PRIVATE KEY" not in environ  # the wrapper took the material out
        assert b"--key-file" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


async def _until_served(url: str, tls, proc: subprocess.Popen[bytes]) -> bytes | None:  # type: ignore[no-untyped-def]
    """``_put_get`` once etcd has started (it takes a moment), within 20 s."""
    for _ in range(200):
        assert proc.poll() is None, "etcd exited"
        try:
            return await _put_get(url, tls)
        except StoreUnavailable:
            await asyncio.sleep(0.1)
    raise AssertionError("etcd did not serve within 20 s")


async def _put_get(url: str, tls):  # type: ignore[no-untyped-def]
    store = store_from_url(url, tls=tls)
    try:
        await store.put("sec/probe", b"ok")
        return await store.get("sec/probe")
    finally:
        await store.close()


def test_run_directory_and_discovery_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run = RunDir("private", tmp_path)
        run.path.mkdir(parents=True)
        (run.path / "old.log").write_text("x")  # left by an earlier version, 0644
        assert run.lock()
        run.release()
        (run.logs / "later.log").write_text("y")  # created after: the umask applies
        for path in (run.path, run.logs):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700
        for path in (run.path / "old.log", run.logs / "later.log", run.path / "lock"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        os.umask(old)

    os.umask(0o022)
    try:
        store = EmbeddedStore(tmp_path / "disc")
        asyncio.run(_put_and_close(store))
        assert stat.S_IMODE((tmp_path / "disc").stat().st_mode) == 0o700
        files = list((tmp_path / "disc").iterdir())
        assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files
    finally:
        os.umask(old)


async def _put_and_close(store: EmbeddedStore) -> None:
    try:
        await store.put("k", b"v")
    finally:
        await store.close()
