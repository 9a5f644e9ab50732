"""The request server against a raw DEALER socket: a client whose route vanishes has its
handlers cancelled at the server's next send to it (``ROUTER_MANDATORY``), long before the
heartbeat timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.planes.request import RequestServer


@pytest.fixture
async def dealer() -> AsyncIterator[zmq.asyncio.Socket]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        yield sock
    finally:
        sock.close(0)
        ctx.term()


async def test_a_vanished_clients_handler_is_cancelled_at_the_next_send(
    dealer: zmq.asyncio.Socket,
) -> None:
    # A heartbeat bound far beyond the test's: only the failed send can cancel in time.
    async with RequestServer("tcp://127.0.0.1:0", heartbeat_timeout=120) as server:
        cancelled = asyncio.Event()

        async def ticks(body: bytes) -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"t"
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        server.register("ticks", ticks)
        dealer.connect(server.address)
        await dealer.send(wire.encode(wire.Request(1, "ticks", b"", 1 << 20)))
        await asyncio.wait_for(dealer.recv(), 10)
        assert server.inflight == 1
        dealer.close(0)  # the route goes: the server's next send finds no peer
        await asyncio.wait_for(cancelled.wait(), 10)
        for _ in range(100):  # the task's done callback runs right after
            if server.inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert server.inflight == 0
