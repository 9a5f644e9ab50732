"""``dynamoctl discovery ls`` against both real backends, as a real subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.discovery.etcd_server import ManagedEtcd
from tests.infra.ports import free_port


def dynamoctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("backend", ["embedded", "etcd"])
async def test_ls_shows_registered_keys(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "embedded":
        url = f"embedded://{tmp_path}"
    else:
        server: ManagedEtcd = request.getfixturevalue("etcd_server")
        url = f"etcd://127.0.0.1:{server.client_port}"
    async with Discovery(store_from_url(url)) as disc:
        await disc.register("cli-test/instances/worker/generate/w1", b'{"pid": 42}')
        # In a thread: the lease's keepalive runs on this loop meanwhile (a CLI start can
        # outlast the 10 s lease on a loaded machine).
        result = await asyncio.to_thread(dynamoctl, "discovery", "ls", "cli-test/", "--url", url)
    assert result.returncode == 0, result.stderr
    assert "cli-test/instances/worker/generate/w1" in result.stdout
    assert '{"pid": 42}' in result.stdout


def test_ls_unreachable_etcd_names_it() -> None:
    port = free_port()
    result = dynamoctl("discovery", "ls", "--url", f"etcd://127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"http://127.0.0.1:{port} unreachable" in result.stderr


def test_ls_unknown_backend_lists_valid_ones() -> None:
    result = dynamoctl("discovery", "ls", "--url", "consul://x:1")
    assert result.returncode == 2
    assert "valid: embedded, etcd" in result.stderr
