"""CURVE on the request and event planes: a real mocker worker with the deployment's key
answers the deployment's own client and nobody else; event streams likewise."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.planes import curve
from dynamoctl.planes.events import Event, EventPublisher, EventSubscriber
from dynamoctl.planes.request import RequestClient
from dynamoctl.security.names import CURVE_SECRET_KEY
from dynamoctl.wire.engine import GenerateChunk, GenerateRequest, decode_chunk
from dynamoctl.wire.engine import encode as encode_engine
from tests.worker.test_worker_process import RunningWorker, start_worker, stop, wait_registered

KEY = curve.generate_secret()


@pytest.fixture
def deployment_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process is a member of the deployment (its components read the key here)."""
    monkeypatch.setenv(CURVE_SECRET_KEY, KEY)
    yield KEY


@pytest.fixture
async def curve_worker(tmp_path: Path, deployment_key: str) -> AsyncIterator[RunningWorker]:
    proc = start_worker(tmp_path, "--speedup-ratio", "50")  # inherits the key
    try:
        yield await wait_registered(f"embedded://{tmp_path}", proc)
    finally:
        stop(proc)


def forged_request() -> list[bytes]:
    body = encode_engine(GenerateRequest("forged", list(range(32)), max_tokens=4))
    return [wire.encode(wire.Request(rid=1, endpoint="generate", body=body, window=16))]


async def send_forged(sock: zmq.asyncio.Socket) -> None:
    """Queue a forged request. A DEALER whose connection the worker refused may have no pipe
    to queue on until it reconnects (seen once under load: the send waited forever); a
    request that cannot even be sent gets no answer either, which is what is asserted."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(sock.send_multipart(forged_request()), 5.0)


async def answer_within(sock: zmq.asyncio.Socket, seconds: float) -> list[bytes] | None:
    """What the worker sends back within ``seconds``, None if nothing."""
    if await sock.poll(seconds * 1000, zmq.POLLIN):
        return list(await sock.recv_multipart())
    return None


async def refused_total(worker: RunningWorker) -> float:
    assert worker.record.metrics_url
    async with httpx.AsyncClient() as http:
        text = (await http.get(worker.record.metrics_url)).text
    line = next(x for x in text.splitlines() if x.startswith("dynamoctl_plane_peers_refused"))
    return float(line.split()[-1])


async def test_a_forged_request_gets_nothing_and_the_deployment_is_served(
    curve_worker: RunningWorker,
) -> None:
    ctx = zmq.asyncio.Context()
    try:
        plain = ctx.socket(zmq.DEALER)  # what anyone on the network can build
        plain.connect(curve_worker.record.address)
        await send_forged(plain)
        assert await answer_within(plain, 2.0) is None

        stranger = ctx.socket(zmq.DEALER)  # knows the server key, not the deployment's
        public, secret = zmq.curve_keypair()
        stranger.curve_serverkey = zmq.curve_public(KEY.encode())
        stranger.curve_publickey, stranger.curve_secretkey = public, secret
        stranger.connect(curve_worker.record.address)
        await send_forged(stranger)
        assert await answer_within(stranger, 2.0) is None
        assert await refused_total(curve_worker) >= 1  # the worker counted the refusal
    finally:
        ctx.destroy(linger=0)

    async with RequestClient() as client:  # the deployment's own: key from the environment
        body = encode_engine(GenerateRequest("own", list(range(32)), max_tokens=4))
        chunks = [
            decode_chunk(raw)
            async for raw in client.stream(curve_worker.record.address, "generate", body)
        ]
    assert sum(len(c.token_ids) for c in chunks) == 4
    assert all(isinstance(c, GenerateChunk) for c in chunks)


async def test_without_the_key_a_client_of_a_curve_worker_gets_no_answer(
    curve_worker: RunningWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CURVE_SECRET_KEY)
    async with RequestClient(heartbeat_interval=0.2, heartbeat_timeout=1.0) as client:
        body = encode_engine(GenerateRequest("keyless", [1, 2, 3], max_tokens=2))
        stream = client.stream(curve_worker.record.address, "generate", body)
        with pytest.raises(Exception) as failure:
            async with asyncio.timeout(10):
                await anext(stream)
    assert not isinstance(failure.value, TimeoutError), "a keyless client must fail, not hang"


async def test_event_streams_reach_members_only(deployment_key: str) -> None:
    async with EventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", topic=b"t") as pub:
        assert pub.replay_address is not None
        member = EventSubscriber(topic=b"t")
        ctx = zmq.asyncio.Context()
        try:
            await member.add_publisher("p", pub.address, pub.replay_address)
            spy = ctx.socket(zmq.SUB)  # a plain subscriber on the same PUB
            spy.setsockopt(zmq.SUBSCRIBE, b"")
            spy.connect(pub.address)
            replay_spy = ctx.socket(zmq.DEALER)  # and on its replay ROUTER
            replay_spy.connect(pub.replay_address)
            await replay_spy.send_multipart([b"", wire.seq_to_bytes(0)])
            deadline = time.monotonic() + 10
            received: list[Event] = []
            while not received and time.monotonic() < deadline:
                pub.publish(b"payload")  # until the member's SUB has connected
                with contextlib.suppress(TimeoutError):
                    item = await asyncio.wait_for(member.get(), 0.2)
                    if isinstance(item, Event):
                        received.append(item)
            assert received and received[0].payload == b"payload"
            assert await answer_within(spy, 1.0) is None
            assert await answer_within(replay_spy, 0.5) is None
        finally:
            await member.close()
            ctx.destroy(linger=0)


def test_a_malformed_key_is_an_error_not_the_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CURVE_SECRET_KEY, "not-a-key")
    with pytest.raises(ValueError, match=CURVE_SECRET_KEY):
        curve.deployment_keys()
    monkeypatch.delenv(CURVE_SECRET_KEY)
    assert curve.deployment_keys() is None
    assert os.environ.get(CURVE_SECRET_KEY) is None
