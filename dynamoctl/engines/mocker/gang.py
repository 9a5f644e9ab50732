"""The mocker's multi-node replica: a leader whose every forward step is a round trip with
each follower (docs/mocker.md, "Multi-node replicas").

Real engines run one collective per step over every node (NCCL, gloo): a follower that
dies or is stopped stalls the leader's next step, and nothing on the leader notices while
it is idle. The mocker keeps exactly that property with real I/O instead of sleeps: the
leader binds a ZeroMQ ROUTER on its rendezvous address (``master_addr:master_port``,
vLLM's flag names) and waits for every follower's :class:`~dynamoctl.wire.gang.Hello`; each
step sends :class:`~dynamoctl.wire.gang.Step` to every follower and ends only when every
:class:`~dynamoctl.wire.gang.Ack` is back. Messages to a follower that is gone are dropped
(no ROUTER_MANDATORY), so a dead follower stalls the leader as NCCL would, until
``collective_timeout`` (vLLM's execute timeout) ends the engine loop.

Not REQ/REP: a lost reply would wedge REQ's state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dynamoctl.engines.api import EngineError
from dynamoctl.engines.spec import LeaderLost
from dynamoctl.wire.engine_args import parse_engine_args
from dynamoctl.wire.gang import DECODER, ENCODER, Ack, Hello, Step, Welcome

log = logging.getLogger(__name__)

HELLO_INTERVAL = 0.2
"""Seconds between a joining follower's hellos (the first may reach no one yet)."""
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 1000, 5000
"""ZMTP heartbeats on the follower's connection: a leader whose host vanished without a
FIN is seen gone after the timeout, as a closed connection is at once."""


class GangError(EngineError):
    """The gang cannot form or lost its leader; the message names the member and address."""


class GangLeader:
    """Rank 0's side of the step channel."""

    def __init__(self, address: str, port: int, nnodes: int) -> None:
        self.endpoint = f"{address}:{port}"
        self.nnodes = nnodes
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._followers: dict[bytes, int] = {}
        """ZeroMQ identity → node rank, fixed once the gang formed."""
        self._seq = 0
        self.step_sent: float | None = None
        """When the step waiting for its acks was sent (monotonic); None between steps."""

    def stalled_for(self) -> float:
        """Seconds the current step has waited for its acks; 0 between steps."""
        sent = self.step_sent
        return 0.0 if sent is None else time.monotonic() - sent

    async def form(self, timeout: float) -> None:
        """Bind and wait until every rank 1..nnodes-1 said hello (a :class:`GangError`
        naming the missing ranks after ``timeout`` seconds)."""
        try:
            self._sock.bind(f"tcp://{self.endpoint}")
        except zmq.ZMQError as exc:
            raise GangError(f"mocker gang: cannot bind {self.endpoint}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while len(self._followers) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._sock.poll(left * 1000):
                missing = set(range(1, self.nnodes)) - set(self._followers.values())
                raise GangError(
                    f"mocker gang: rank(s) {', '.join(map(str, sorted(missing)))} never joined "
                    f"{self.endpoint} within {timeout:g} s"
                )
            identity, data = await self._sock.recv_multipart()
            message = DECODER.decode(data)
            if isinstance(message, Hello) and self._admit(identity, message):
                await self._sock.send_multipart([identity, ENCODER.encode(Welcome())])
        log.info("[mocker] gang of %d formed on %s", self.nnodes, self.endpoint)

    def _admit(self, identity: bytes, hello: Hello) -> bool:
        if hello.nnodes != self.nnodes or not 1 <= hello.rank < self.nnodes:
            log.error("[mocker] refused %s on %s (gang of %d)", hello, self.endpoint, self.nnodes)
            return False
        if hello.rank in self._followers.values() and self._followers.get(identity) != hello.rank:
            log.error(
                "[mocker] rank %d joined twice on %s; kept the first", hello.rank, self.endpoint
            )
            return False
        self._followers[identity] = hello.rank
        return True

    async def step(self) -> None:
        """One collective: :class:`Step` to every follower, back when all acked it. Never
        times out by itself (the caller bounds it, as vLLM's execute timeout does)."""
        self._seq += 1
        seq = self._seq
        frame = ENCODER.encode(Step(seq))
        for identity in self._followers:
            await self._sock.send_multipart([identity, frame])
        waiting = set(self._followers.values())
        self.step_sent = time.monotonic()
        while waiting:
            identity, data = await self._sock.recv_multipart()
            message = DECODER.decode(data)
            if isinstance(message, Ack) and message.seq == seq:
                waiting.discard(message.rank)
            elif isinstance(message, Hello) and identity not in self._followers:
                # A restarted follower cannot rejoin a running gang: gangs restart whole.
                log.error("[mocker] rank %d tried to join a running gang", message.rank)
        self.step_sent = None

    async def step_within(self, timeout: float) -> None:
        """:meth:`step`, or a :class:`GangError` after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self.step(), timeout)
        except asyncio.TimeoutError:
            raise GangError(
                f"mocker gang on {self.endpoint}: step {self._seq} not acknowledged by every "
                f"follower within {timeout:g} s"
            ) from None

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


async def follow(address: str, port: int, rank: int, nnodes: int, timeout: float) -> str:
    """Rank ``rank``'s side: join within ``timeout`` seconds (else :class:`GangError`),
    then answer every step until the leader's connection ends. Returns why it ended."""
    endpoint = f"{address}:{port}"
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(f"tcp://{endpoint}")
        await _join(sock, endpoint, Hello(rank, nnodes), timeout)
        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if monitor in ready:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    return f"the leader at {endpoint} went away"
            if sock in ready:
                message = DECODER.decode(await sock.recv())
                if isinstance(message, Step):
                    await sock.send(ENCODER.encode(Ack(message.seq, rank)))
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


async def _join(sock: zmq.asyncio.Socket, endpoint: str, hello: Hello, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        await sock.send(ENCODER.encode(hello))
        left = deadline - time.monotonic()
        if left <= 0:
            raise GangError(
                f"rank {hello.rank}: the leader at {endpoint} did not take it into its gang "
                f"within {timeout:g} s"
            )
        answered = await sock.poll(min(HELLO_INTERVAL, left) * 1000)
        if answered and isinstance(DECODER.decode(await sock.recv()), Welcome):
            return


def follow_leader(label: str, host: str, port: int, left: float, argv: Sequence[str]) -> int:
    """``dynamoctl follower``'s mocker side (:data:`~dynamoctl.engines.spec.FollowerEntry`):
    answer every simulated step; 1 when the leader's connection ends."""
    options = parse_engine_args(argv)
    try:
        why = asyncio.run(
            follow(host, port, int(options["node_rank"]), int(options["nnodes"]), left)
        )
    except GangError as exc:
        raise LeaderLost(str(exc)) from exc
    log.error("%s: %s; exiting", label, why)
    return 1
