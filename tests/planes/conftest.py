"""Fixtures for the plane tests: loopback addresses, short heartbeats, a peer process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from dynamoctl.planes.request import RequestClient, RequestServer

# Short heartbeats keep the failure tests fast; peer.py uses the same values.
HEARTBEAT_INTERVAL = 0.2
HEARTBEAT_TIMEOUT = 1.0

PEER = Path(__file__).with_name("peer.py")


@pytest.fixture
async def server() -> AsyncIterator[RequestServer]:
    async with RequestServer("tcp://127.0.0.1:0", heartbeat_timeout=HEARTBEAT_TIMEOUT) as srv:
        yield srv


@pytest.fixture
async def client() -> AsyncIterator[RequestClient]:
    async with RequestClient(
        heartbeat_interval=HEARTBEAT_INTERVAL, heartbeat_timeout=HEARTBEAT_TIMEOUT
    ) as cli:
        yield cli


class Peer:
    """A ``peer.py`` subprocess in its own process group; reads its stdout lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self, seconds: float = 15.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), seconds)
        if not raw:
            raise AssertionError(f"peer exited early with {await self.proc.wait()}")
        return raw.decode().strip()

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # killed already, not yet reaped
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
async def spawn() -> AsyncIterator[Callable[..., Awaitable[Peer]]]:
    peers: list[Peer] = []

    async def start(*args: str) -> Peer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(PEER), *args,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        peers.append(Peer(proc))
        return peers[-1]

    yield start
    for peer in peers:
        peer.kill()
        await peer.proc.wait()
