"""Request plane in one process: streaming, multiplexing, cancel, backpressure, errors."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamoctl import wire
from dynamoctl.planes.request import (
    ClientClosedError,
    Overloaded,
    PeerDeadError,
    RemoteError,
    RequestClient,
    RequestServer,
    UnknownEndpointError,
)


async def numbers(body: bytes) -> AsyncIterator[bytes]:
    for i in range(int(body)):
        yield b"%d" % i


class Producer:
    """An endless handler that records how far it got and how it ended."""

    def __init__(self, pause: float | None = None) -> None:
        self.pause = pause
        self.produced = 0
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, body: bytes) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            while True:
                self.produced += 1
                yield b"x"
                if self.pause is not None:
                    await asyncio.sleep(self.pause)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_ten_thousand_chunks_arrive_complete_and_in_order(
    server: RequestServer, client: RequestClient
) -> None:
    server.register("numbers", numbers)
    got = [c async for c in client.stream(server.address, "numbers", b"10000")]
    assert got == [b"%d" % i for i in range(10_000)]


async def test_concurrent_streams_interleave_each_in_order(
    server: RequestServer, client: RequestClient
) -> None:
    server.register("numbers", numbers)
    arrivals: list[int] = []

    async def consume(k: int) -> list[bytes]:
        out = []
        async for chunk in client.stream(server.address, "numbers", b"2000", window=8):
            out.append(chunk)
            arrivals.append(k)
        return out

    results = await asyncio.wait_for(asyncio.gather(*(consume(k) for k in range(6))), 30)
    for out in results:
        assert out == [b"%d" % i for i in range(2000)]
    # Multiplexed, not serialised: some stream got chunks before another one finished.
    first_end = min(len(arrivals) - arrivals[::-1].index(k) for k in range(6))
    assert len(set(arrivals[:first_end])) > 1


async def test_empty_chunks_and_empty_streams_are_preserved(
    server: RequestServer, client: RequestClient
) -> None:
    async def blanks(body: bytes) -> AsyncIterator[bytes]:
        for _ in range(int(body)):
            yield b""

    server.register("blanks", blanks)
    assert [c async for c in client.stream(server.address, "blanks", b"3")] == [b""] * 3
    assert [c async for c in client.stream(server.address, "blanks", b"0")] == []


@pytest.mark.parametrize("pause", [None, 3600.0], ids=["parked-at-yield", "running"])
@pytest.mark.parametrize("how", ["aclose", "break", "task-cancel"])
async def test_leaving_a_stream_cancels_the_handler(
    server: RequestServer, client: RequestClient, how: str, pause: float | None
) -> None:
    producer = Producer(pause)
    server.register("endless", producer)

    async def consume() -> None:
        stream = client.stream(server.address, "endless", b"", window=16)
        async for _ in stream:
            if how == "aclose":
                await stream.aclose()
                return
            if how == "break":
                break
            await asyncio.Event().wait()  # "task-cancel": block until cancelled

    task = asyncio.create_task(consume())
    await asyncio.wait_for(producer.started.wait(), 5)
    if how == "task-cancel":
        await asyncio.sleep(0.05)
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gc.collect()  # "break": the abandoned generator is finalised, which sends the Cancel
    await asyncio.wait_for(producer.cancelled.wait(), 5)
    assert producer.produced <= 16 + 1  # stopped by credit, then by the cancel
    await asyncio.sleep(0.1)
    assert producer.produced <= 17
    assert server.inflight == 0


async def test_a_slow_consumer_bounds_unacknowledged_chunks_by_the_window(
    server: RequestServer, client: RequestClient
) -> None:
    window, total = 8, 400
    produced = 0

    async def counted(body: bytes) -> AsyncIterator[bytes]:
        nonlocal produced
        for _ in range(total):
            produced += 1
            yield b"."

    server.register("counted", counted)
    consumed, worst = 0, 0
    async for _ in client.stream(server.address, "counted", b"", window=window):
        consumed += 1
        worst = max(worst, produced - consumed)
        assert produced - consumed <= window
        if consumed == 1:
            await asyncio.sleep(0.2)  # give an unbounded producer time to run ahead
            assert produced <= window
        elif consumed % 50 == 0:
            await asyncio.sleep(0.01)
    assert consumed == total
    assert worst >= window // 2  # the window was actually used, not trivially respected


async def test_unknown_endpoint_names_the_known_ones(
    server: RequestServer, client: RequestClient
) -> None:
    server.register("numbers", numbers)
    with pytest.raises(UnknownEndpointError, match=r"'nope'.*known: numbers"):
        await asyncio.wait_for(anext(client.stream(server.address, "nope", b"")), 5)


async def test_a_handler_exception_reaches_the_consumer_after_its_chunks(
    server: RequestServer, client: RequestClient
) -> None:
    async def flaky(body: bytes) -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        raise ValueError("engine exploded")

    server.register("flaky", flaky)
    got = []
    with pytest.raises(RemoteError, match="ValueError: engine exploded"):
        async for chunk in client.stream(server.address, "flaky", b""):
            got.append(chunk)
    assert got == [b"a", b"b"]
    assert server.inflight == 0


async def test_a_handler_yielding_str_is_an_error_not_a_hang(
    server: RequestServer, client: RequestClient
) -> None:
    async def wrong(body: bytes) -> AsyncIterator[bytes]:
        yield "text"  # type: ignore[misc]

    server.register("wrong", wrong)
    with pytest.raises(RemoteError, match="TypeError"):
        await asyncio.wait_for(anext(client.stream(server.address, "wrong", b"")), 5)


async def test_beyond_max_inflight_requests_are_refused_with_overloaded(
    client: RequestClient,
) -> None:
    gate, both_running = asyncio.Event(), asyncio.Event()
    running = 0

    async def gated(body: bytes) -> AsyncIterator[bytes]:
        nonlocal running
        running += 1
        if running == 2:
            both_running.set()
        await gate.wait()
        yield b"done"

    async with RequestServer(max_inflight=2) as server:
        server.register("gated", gated)
        busy = [client.stream(server.address, "gated", b"") for _ in range(2)]
        pending = [asyncio.create_task(anext(s)) for s in busy]
        await asyncio.wait_for(both_running.wait(), 5)
        assert server.inflight == 2
        with pytest.raises(Overloaded, match="max_inflight"):
            await asyncio.wait_for(anext(client.stream(server.address, "gated", b"")), 5)
        gate.set()
        assert await asyncio.wait_for(asyncio.gather(*pending), 5) == [b"done", b"done"]
        for s in busy:
            await s.aclose()


async def test_a_silent_server_fails_open_streams_with_peer_dead(
    client: RequestClient,
) -> None:
    server = RequestServer()
    await server.start()
    server.register("endless", Producer(pause=0.01))
    stream = client.stream(server.address, "endless", b"")
    await asyncio.wait_for(anext(stream), 5)
    await server.close()  # no goodbye: its clients must notice by themselves
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(PeerDeadError):
        async for _ in stream:
            pass
    assert loop.time() - t0 < client.heartbeat_timeout + 2.0


async def test_a_server_restarted_on_the_same_address_is_noticed(
    client: RequestClient,
) -> None:
    gate = asyncio.Event()

    async def slow(body: bytes) -> AsyncIterator[bytes]:
        yield b"first"
        await gate.wait()
        yield b"never"

    first = RequestServer()
    await first.start()
    first.register("slow", slow)
    stream = client.stream(first.address, "slow", b"")
    assert await asyncio.wait_for(anext(stream), 5) == b"first"
    await first.close()
    async with RequestServer(first.address) as second:  # alive, answers pings, knows nothing
        second.register("slow", slow)
        with pytest.raises(PeerDeadError):
            await asyncio.wait_for(anext(stream), client.heartbeat_timeout + 2.0)


async def test_closing_the_client_fails_open_streams_and_cancels_them() -> None:
    producer = Producer(pause=0.01)
    # A heartbeat timeout far beyond the test: only the client's Cancel can stop it.
    async with RequestServer(heartbeat_timeout=60) as server:
        server.register("endless", producer)
        client = RequestClient()
        stream = client.stream(server.address, "endless", b"")
        await asyncio.wait_for(anext(stream), 5)
        await client.close()
        with pytest.raises(ClientClosedError):
            await asyncio.wait_for(anext(stream), 5)
        with pytest.raises(ClientClosedError):
            await anext(client.stream(server.address, "endless", b""))
        await asyncio.wait_for(producer.cancelled.wait(), 5)


async def test_ipc_addresses_work(tmp_path: Path, client: RequestClient) -> None:
    async with RequestServer(f"ipc://{tmp_path}/worker.sock") as server:
        server.register("numbers", numbers)
        assert server.address.startswith("ipc://")
        got = [c async for c in client.stream(server.address, "numbers", b"3")]
        assert got == [b"0", b"1", b"2"]


async def test_a_port_zero_address_resolves_to_the_bound_port(server: RequestServer) -> None:
    host, port = server.address.removeprefix("tcp://").rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) > 0


async def test_handler_refusing_before_first_chunk_is_overloaded() -> None:
    from dynamoctl.planes.request import NotAccepting, Overloaded

    async def refuse(body: bytes) -> AsyncIterator[bytes]:
        raise NotAccepting("draining")
        yield b""  # pragma: no cover - makes this an async generator

    async with RequestServer() as server, RequestClient() as client:
        server.register("gen", refuse)
        with pytest.raises(Overloaded, match="draining"):
            async for _ in client.stream(server.address, "gen", b""):
                pass


async def test_a_long_client_silence_bound_keeps_pinging_within_the_servers() -> None:
    # The frontend's --stream-silence-timeout of 20 s once meant a ping every 5 s, past
    # the worker's 3 s bound: the server cancelled every stream quiet for 3 s (a long
    # prefill). Pings now come within a quarter of the server's bound, whatever the client's.
    async def slow_first_chunk(body: bytes) -> AsyncIterator[bytes]:
        await asyncio.sleep(wire.SERVER_HEARTBEAT_TIMEOUT + 1.5)
        yield b"first"

    async with (
        RequestServer("tcp://127.0.0.1:0") as srv,
        RequestClient(heartbeat_interval=5.0, heartbeat_timeout=20.0) as cli,
    ):
        srv.register("slow", slow_first_chunk)
        got = await asyncio.wait_for(_collect(cli.stream(srv.address, "slow", b"")), 15)
    assert got == [b"first"]
    assert cli.heartbeat_interval <= wire.SERVER_HEARTBEAT_TIMEOUT / 4


async def _collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


async def test_runs_hold_every_chunk_that_arrived_in_order_within_the_window(
    server: RequestServer, client: RequestClient
) -> None:
    server.register("numbers", numbers)
    window, runs = 16, []
    async for run in client.stream_runs(server.address, "numbers", b"3000", window=window):
        runs.append(run)
        assert 1 <= len(run) <= window
        if len(runs) % 10 == 1:
            await asyncio.sleep(0.01)  # fall behind: the next run holds what arrived meanwhile
    assert [c for run in runs for c in run] == [b"%d" % i for i in range(3000)]
    assert max(map(len, runs)) > 1  # a consumer behind gets several chunks in one step
    assert len(runs) < 3000


async def test_cancelling_the_task_iterating_runs_cancels_the_handler(
    server: RequestServer, client: RequestClient
) -> None:
    producer = Producer(0.001)
    server.register("endless", producer)

    async def consume() -> None:
        async for _ in client.stream_runs(server.address, "endless", b"", window=16):
            await asyncio.Event().wait()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(producer.started.wait(), 5)
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(producer.cancelled.wait(), 5)
    assert server.inflight == 0
