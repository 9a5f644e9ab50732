"""An SSH deployment is locked by default (real sshds in network namespaces): the managed
etcd serves TLS to the deployment's certificate only, workers answer only CURVE peers with
the deployment's key, and no key material is on any host's command lines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest
import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.discovery import store_from_url
from dynamoctl.discovery.api import StoreUnavailable
from dynamoctl.recipe.loader import load_recipe
from dynamoctl.supervisor import credentials
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.engine import encode as encode_engine
from tests.infra.ssh_hosts import SshHosts
from tests.launch.conftest import ssh_hosts2
from tests.launch.test_ssh_up import _cli, _ours_on, _write_recipe
from tests.supervisor.conftest import free_port

__all__ = ["ssh_hosts2"]  # the fixture, used by name


async def _worker_addresses(url: str, tls: object) -> list[str]:
    store = store_from_url(url, tls=tls)  # type: ignore[arg-type]
    try:
        listing = await store.list("sshlock/instances/worker/")
    finally:
        await store.close()
    return [wire.decode_json(raw, wire.InstanceRecord).address for raw in listing.items.values()]


async def _plain_put(url: str) -> None:
    store = store_from_url(url)
    try:
        await store.put("sshlock/instances/worker/generate/forged", b"{}")
    finally:
        await store.close()


async def _forged_answer(address: str) -> list[bytes] | None:
    ctx = zmq.asyncio.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(address)
        body = encode_engine(GenerateRequest("forged", list(range(16)), max_tokens=2))
        await sock.send(wire.encode(wire.Request(rid=1, endpoint="generate", body=body, window=8)))
        return list(await sock.recv_multipart()) if await sock.poll(2000, zmq.POLLIN) else None
    finally:
        ctx.destroy(linger=0)


def test_an_ssh_deployment_is_locked_by_default(ssh_hosts2: SshHosts, tmp_path: Path) -> None:
    hosts, port = ssh_hosts2, free_port()
    head = hosts.names[0]
    recipe_file = _write_recipe(hosts, tmp_path, port, "sshlock")
    cli = _cli(tmp_path)
    up = cli("up", str(recipe_file), "--detach")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        client = openai.OpenAI(base_url=f"http://{head}:{port}/v1", api_key="none", timeout=30)
        for _ in range(4):  # both workers, over CURVE, registered in a TLS etcd
            out = client.completions.create(
                model="mock-llama", prompt="hi there", max_tokens=3, extra_body={"ignore_eos": True}
            )
            assert out.usage is not None and out.usage.completion_tokens == 3

        run = tmp_path / "home" / "runs" / "sshlock"
        state = json.loads((run / "state.json").read_text())
        url = state["plan"]["discovery_url"]
        assert url == f"etcd+https://{hosts.addresses[0]}:2379"
        with pytest.raises(StoreUnavailable):  # plain HTTP: no forged registration
            asyncio.run(_plain_put(url.replace("etcd+https://", "etcd://")))

        tls = credentials.supervisor_etcd_tls(load_recipe(recipe_file), run)
        addresses = asyncio.run(_worker_addresses(url, tls))
        assert len(addresses) == 2 and "forged" not in " ".join(addresses)
        for address in addresses:
            assert asyncio.run(_forged_answer(address)) is None

        key = (run / "keys" / "planes.key").read_text().strip()
        assert _ours_on(hosts, key, "PRIVATE KEY", "BEGIN CERTIFICATE") == []
        assert key not in json.dumps(state)
    finally:
        cli("down", "sshlock", "--now")
