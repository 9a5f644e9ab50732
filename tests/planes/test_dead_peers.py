"""A request-plane server whose process dies is noticed from its closed connection, not
from a heartbeat: the client's heartbeat timeout here is 10 minutes, so only the socket
monitor can fail the stream (docs/planes.md, "Dead peers")."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dynamoctl import wire
from dynamoctl.planes.request import PeerDeadError, RequestClient, RequestServer
from tests.infra.ports import free_port

NEVER = 600.0
"""A heartbeat timeout no test outlives: a failure seen must come from the monitor."""

Spawn = Callable[..., Awaitable[Any]]  # conftest.Peer


@pytest.fixture
async def patient_client() -> AsyncIterator[RequestClient]:
    async with RequestClient(heartbeat_interval=0.2, heartbeat_timeout=NEVER) as cli:
        yield cli


class PeerEvents:
    """What the client reports of its servers' connections, as it happens."""

    def __init__(self, client: RequestClient) -> None:
        self.changed = asyncio.Event()
        client.peer_listeners.append(lambda address, down: self.changed.set())

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait for ``condition`` after each reported change; the bound only keeps a
        broken build from hanging."""
        async with asyncio.timeout(30):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


async def test_a_killed_server_fails_the_stream_at_once_and_is_down(
    spawn: Spawn, patient_client: RequestClient
) -> None:
    client = patient_client
    peer = await spawn("server")
    address = await peer.line()
    received = 0
    assert not client.peer_down(address)

    async def consume() -> None:
        nonlocal received
        async for _ in client.stream(address, "count", b""):
            received += 1
            if received == 50:
                peer.kill()

    with pytest.raises(PeerDeadError, match="closed the connection"):
        async with asyncio.timeout(30):
            await consume()
    await peer.proc.wait()
    assert received >= 50
    assert client.peer_down(address)
    # A new stream to the dead address fails before anything is sent.
    with pytest.raises(PeerDeadError, match="has not come back"):
        await anext(client.stream(address, "count", b""))


async def test_a_server_answering_again_at_the_address_is_up(
    patient_client: RequestClient,
) -> None:
    client = patient_client
    events = PeerEvents(client)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"

    async def hello(body: bytes) -> AsyncIterator[bytes]:
        yield b"hello"

    first = RequestServer(address)
    first.register("hello", hello)
    async with first:
        assert [c async for c in client.stream(address, "hello", b"")] == [b"hello"]
    await events.until(lambda: client.peer_down(address))  # closed: the connection dropped

    second = RequestServer(address)
    second.register("hello", hello)
    async with second:
        await events.until(lambda: not client.peer_down(address))  # ZeroMQ reconnected
        assert [c async for c in client.stream(address, "hello", b"")] == [b"hello"]


async def test_a_long_dead_address_is_forgotten(spawn: Spawn) -> None:
    async with RequestClient(
        heartbeat_interval=0.05, heartbeat_timeout=NEVER, forget_down_after=0.0
    ) as client:
        events = PeerEvents(client)
        peer = await spawn("server")
        address = await peer.line()
        stream = client.stream(address, "count", b"")
        await anext(stream)
        peer.kill()
        with pytest.raises(PeerDeadError):
            async with asyncio.timeout(30):
                async for _ in stream:
                    pass
        await events.until(lambda: address not in client.addresses())
        assert not client.peer_down(address)  # no connection: unknown, not down


async def answering_server(spawn: Spawn, client: RequestClient) -> tuple[Any, str]:
    """A ``peer.py`` server the client has streamed from and heard a few heartbeats of:
    (the peer, its address)."""
    peer = await spawn("server")
    address = await peer.line()
    stream = client.stream(address, "count", b"")
    await anext(stream)
    await stream.aclose()
    await asyncio.sleep(0.5)  # a few heartbeats answered
    return peer, address


async def test_a_stall_of_our_own_loop_is_no_silence_of_the_server(spawn: Spawn) -> None:
    """The client's own event loop blocked for twice the heartbeat timeout sent no Ping, so
    none went unanswered: the live server is never reported down. A server that stops
    answering (SIGSTOP) still is, within the timeout and a heartbeat or two."""
    async with RequestClient(heartbeat_interval=0.2, heartbeat_timeout=1.0) as client:
        events = PeerEvents(client)
        reports: list[tuple[str, bool]] = []
        client.peer_listeners.append(lambda address, down: reports.append((address, down)))
        peer, address = await answering_server(spawn, client)

        # Our own loop stalls, as under a long tokenisation or a starved CPU: deliberately
        # blocking, and just after a heartbeat queued its Ping (it leaves after the stall:
        # the stall is not the server's silence either).
        client._conns[address].ping()
        time.sleep(2 * client.heartbeat_timeout)  # noqa: ASYNC251
        await asyncio.sleep(4 * client.heartbeat_interval)  # heartbeats after the stall
        assert not client.peer_down(address)
        assert (address, True) not in reports, reports

        os.kill(peer.proc.pid, signal.SIGSTOP)  # the server itself stops answering
        try:
            await events.until(lambda: client.peer_down(address))
            assert (address, True) in reports
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)


async def test_a_server_that_stops_reading_is_silent_though_no_ping_could_leave(
    spawn: Spawn,
) -> None:
    """A frozen server's socket buffers fill, and our messages then wait at the
    high-water mark, the heartbeat's Ping behind them: no Ping leaves, so none goes
    unanswered, and the silence is counted from when sending stopped (``blocked_since``).
    The server answers again once it runs."""
    async with RequestClient(heartbeat_interval=0.2, heartbeat_timeout=1.0) as client:
        events = PeerEvents(client)
        peer, address = await answering_server(spawn, client)
        conn = client._conns[address]
        for _ in range(1000):  # until no Ping is on its way: none may be caught by the freeze
            if conn.unanswered_since is None and not conn._ping_queued:
                break
            await asyncio.sleep(0.01)
        os.kill(peer.proc.pid, signal.SIGSTOP)
        try:
            # In the same loop turn, before the next heartbeat: more than the kernel's
            # buffers and the socket's 1000-message high-water mark hold.
            body = b"\0" * 4096
            for rid in range(1 << 20, (1 << 20) + 4000):
                conn.post(wire.Request(rid, "nothing", body, 1))
            await events.until(lambda: client.peer_silent(address))
            assert conn.unanswered_since is None  # no Ping left: only the blocked queue
            assert conn.blocked_since is not None
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        await events.until(lambda: not client.peer_silent(address))  # it reads, answers
