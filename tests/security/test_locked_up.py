"""A local ``dynamoctl up`` with CURVE forced on by the recipe and a secret in
``pool.env``: the deployment serves, strangers get nothing from its workers, the secret
reaches the worker's environment and nothing else (argv, dry run, state, logs), and the
run directory is private."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import openai
import psutil
import pytest
import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.discovery import store_from_url
from dynamoctl.security.names import CURVE_SECRET_KEY
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.engine import encode as encode_engine
from tests.supervisor.conftest import Cli, cli, free_port, live_in_group, mocker_recipe

__all__ = ["cli"]  # the fixture, used by name

TOKEN = "hf_s3cr3t-never-written"
POOL_ENV = "    env: {HF_TOKEN: {from_env: TEST_LOCKED_HF_TOKEN}, PLAIN_SETTING: visible}\n"


def locked_recipe(port: int) -> str:
    text = mocker_recipe("locked", port, replicas=1, extra="security: {curve: true}\n")
    marker = "    engine_args:"
    return text.replace(marker, POOL_ENV + marker, 1)


def forged_answer(address: str) -> list[bytes] | None:
    """What a plain DEALER gets for a hand-built request within 2 s (None: nothing)."""

    async def attempt() -> list[bytes] | None:
        ctx = zmq.asyncio.Context()
        try:
            sock = ctx.socket(zmq.DEALER)
            sock.connect(address)
            body = encode_engine(GenerateRequest("forged", list(range(16)), max_tokens=2))
            await sock.send(
                wire.encode(wire.Request(rid=1, endpoint="generate", body=body, window=8))
            )
            if await sock.poll(2000, zmq.POLLIN):
                return list(await sock.recv_multipart())
            return None
        finally:
            ctx.destroy(linger=0)

    return asyncio.run(attempt())


def worker_address(run: Path) -> str:
    async def lookup() -> str:
        store = store_from_url(f"embedded://{run / 'discovery'}")
        try:
            listing = await store.list("locked/instances/worker/")
        finally:
            await store.close()
        (raw,) = listing.items.values()
        return wire.decode_json(raw, wire.InstanceRecord).address

    return asyncio.run(lookup())


def test_a_locked_local_deployment_serves_its_own_and_leaks_nothing(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LOCKED_HF_TOKEN", TOKEN)
    port = free_port()
    recipe = cli.recipe(locked_recipe(port))

    dry = cli("up", str(recipe), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "HF_TOKEN=<from env TEST_LOCKED_HF_TOKEN>" in dry.stdout
    assert f"{CURVE_SECRET_KEY}=<from file " in dry.stdout
    assert "PLAIN_SETTING=visible" in dry.stdout
    assert TOKEN not in dry.stdout

    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    out = client.completions.create(
        model="mock-llama", prompt="hi", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 4  # over CURVE

    run = cli.home / "runs" / "locked"
    assert forged_answer(worker_address(run)) is None

    report = cli.status()
    keeper = next(row["pid"] for row in report["instances"] if row["name"] == "agg-0")
    key = (run / "keys" / "planes.key").read_text().strip()
    worker_envs = []
    for pid in live_in_group(keeper):
        proc = psutil.Process(pid)
        cmdline = " ".join(proc.cmdline())
        assert TOKEN not in cmdline and key not in cmdline
        worker_envs.append(proc.environ())
    assert any(env.get("HF_TOKEN") == TOKEN for env in worker_envs)
    assert any(env.get(CURVE_SECRET_KEY) == key for env in worker_envs)

    down = cli("down")
    assert down.returncode == 0, down.stderr
    for path in [run, *run.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        if path.is_dir():
            assert mode == 0o700, f"{path} is {oct(mode)}"
        else:
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
            if path.name != "planes.key":
                assert TOKEN.encode() not in path.read_bytes(), path
                assert key.encode() not in path.read_bytes(), path
    assert os.environ.get(CURVE_SECRET_KEY) is None  # the test process never had it
