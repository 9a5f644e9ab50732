"""Request plane against real processes killed with SIGKILL: nothing hangs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dynamoctl.planes.request import PeerDeadError, RequestClient, RequestServer

# Detection takes the heartbeat timeout plus one check interval; 2 s more of slack for a
# loaded 2-core CI machine. The fixtures and peer.py use a 1 s timeout.
SLACK = 2.0

Spawn = Callable[..., Awaitable[Any]]  # conftest.Peer


async def test_a_killed_server_fails_the_stream_with_peer_dead(
    spawn: Spawn, client: RequestClient
) -> None:
    bound = client.heartbeat_timeout + SLACK
    peer = await spawn("server")
    address = await peer.line()
    loop = asyncio.get_running_loop()
    killed_at: float | None = None

    async def consume() -> None:
        nonlocal killed_at
        received = 0
        async for _ in client.stream(address, "count", b""):
            received += 1
            if received == 50:
                peer.kill()
                killed_at = loop.time()

    with pytest.raises(PeerDeadError):
        await asyncio.wait_for(consume(), 30)
    assert killed_at is not None
    assert loop.time() - killed_at < bound


async def test_a_killed_client_gets_its_handler_cancelled(
    spawn: Spawn, server: RequestServer
) -> None:
    bound = server.heartbeat_timeout + SLACK
    cancelled = asyncio.Event()

    async def hold(body: bytes) -> AsyncIterator[bytes]:
        try:
            while True:  # the client stops consuming: parked at yield, out of credit
                yield b"x"
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server.register("hold", hold)
    peer = await spawn("client", server.address)
    assert await peer.line() == "streaming"
    assert server.inflight == 1
    loop = asyncio.get_running_loop()
    peer.kill()
    killed_at = loop.time()
    await asyncio.wait_for(cancelled.wait(), bound)
    assert loop.time() - killed_at < bound
    assert server.inflight == 0
