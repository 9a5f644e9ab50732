"""Event publisher: PUB socket + replay ROUTER with a bounded ring buffer.

Frames are vLLM's (see :mod:`dynamoctl.planes.events`), so our subscriber treats a real
vLLM worker and ours alike. One publisher is one stream: one topic, one sequence. A worker
that publishes KV events and load metrics runs two publishers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.planes import _zmq
from dynamoctl.util.aio import AsyncService

logger = logging.getLogger(__name__)

SnapshotProvider = Callable[[], tuple[int, bytes]]
"""Returns ``(seq, payload)``: the full state after event ``seq`` (-1 before any)."""


class EventPublisher(AsyncService):
    """Publish one sequenced stream; answer replay requests from its buffer.

    ``publish`` is synchronous (a PUB send never waits: past ``sndhwm`` ZeroMQ drops, and
    subscribers recover through replay), so an engine loop can call it inline.
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:0",
        replay_address: str | None = "tcp://127.0.0.1:0",
        *,
        topic: bytes = b"",
        buffer_size: int = 10_000,
        snapshot: SnapshotProvider | None = None,
        sndhwm: int = 100_000,
    ) -> None:
        self._bind = address
        self._replay_bind = replay_address
        self.topic = topic
        self.buffer_size = buffer_size
        """Entries kept for replay (vLLM's ``buffer_steps``); at least 1."""
        self.snapshot = snapshot
        """Answers replays that start before the buffer (our extension)."""
        self.sndhwm = sndhwm
        """PUB high-water mark per subscriber; beyond it messages are dropped."""
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=max(1, buffer_size))
        self._next = 0
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._address = ""
        self._replay_address: str | None = None

    @property
    def address(self) -> str:
        """The PUB address with the real port, once started."""
        if not self._address:
            raise RuntimeError("EventPublisher.address is known only after start()")
        return self._address

    @property
    def replay_address(self) -> str | None:
        """The replay ROUTER address with the real port, once started (None: no replay)."""
        return self._replay_address

    @property
    def next_seq(self) -> int:
        """The seq the next :meth:`publish` returns."""
        return self._next

    async def start(self) -> None:
        pub = _zmq.sync_context().socket(zmq.PUB)
        _zmq.secure_server(pub)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self.sndhwm)
        self._address = await _zmq.bind(pub, self._bind)
        self._pub = pub
        if self._replay_bind is not None:
            try:
                await self._start_replay(self._replay_bind)
            except BaseException:
                await self.close()
                raise
        logger.info("publishing events on %s (replay %s)", self._address, self._replay_address)

    async def _start_replay(self, address: str) -> None:
        replay = _zmq.async_context().socket(zmq.ROUTER)
        _zmq.secure_server(replay)
        replay.setsockopt(zmq.LINGER, 0)
        # An answer is at most buffer_size messages; a bounded pipe would silently drop
        # its tail (ROUTER drops at the HWM), which the subscriber would misread.
        replay.setsockopt(zmq.SNDHWM, 0)
        replay.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._replay_address = await _zmq.bind(replay, address)
        self._replay = replay
        self._task = asyncio.create_task(self._serve_replay(), name="event-replay")

    def publish(self, payload: bytes) -> int:
        """Send ``payload`` as the next event of the stream; returns its seq.

        ``payload`` must not be empty: vLLM-style subscribers read an empty payload in a
        replay answer as its end.
        """
        if self._pub is None:
            raise RuntimeError("EventPublisher is not started (or closed)")
        if not payload:
            raise ValueError("event payload must not be empty (it marks the end of a replay)")
        seq = self._next
        self._next += 1
        self._buffer.append((seq, payload))
        self._pub.send_multipart((self.topic, wire.seq_to_bytes(seq), payload))
        return seq

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        _zmq.close(self._replay)
        _zmq.close(self._pub)
        self._pub = self._replay = None

    # ------------------------------------------------------------------ replay

    def answer(self, start: int) -> list[tuple[bytes, ...]]:
        """The reply frames (without envelope) for a replay request from ``start``."""
        return replay_answer(self._buffer, self._next, start, self.snapshot)

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            request = await self._replay.recv_multipart()
            # [identity, b"", start] from a DEALER/REQ that mimics REQ framing (vLLM's);
            # [identity, start] from a bare DEALER: answer with the same envelope.
            if len(request) not in (2, 3) or len(request[-1]) != 8:
                logger.warning("invalid replay request with %d frames", len(request))
                continue
            envelope, start = request[:-1], wire.seq_from_bytes(request[-1])
            try:
                for frames in self.answer(start):
                    await self._replay.send_multipart((*envelope, *frames))
            except zmq.ZMQError as exc:  # EHOSTUNREACH: the requester went away
                logger.info("replay answer from %d abandoned: %s", start, exc)


def replay_answer(
    buffer: Sequence[tuple[int, bytes]],
    next_seq: int,
    start: int,
    snapshot: SnapshotProvider | None,
) -> list[tuple[bytes, ...]]:
    """Reply frames for a replay from ``start``, given the ring buffer (oldest first) and
    the seq the next publish will get.

    Built synchronously, so a snapshot and the entries after it describe one instant.
    """
    oldest = buffer[0][0] if buffer else next_seq
    frames: list[tuple[bytes, ...]] = []
    if snapshot is not None and (start < oldest or start > next_seq):
        # Before the buffer (evicted) or past the end (we restarted): only a snapshot
        # makes the subscriber whole.
        seq, state = snapshot()
        frames.append((wire.snapshot_seq_to_bytes(seq), state, wire.SNAPSHOT_MARKER))
        start = seq  # entry ``seq`` too: it anchors the subscriber's next replay
    frames += [(wire.seq_to_bytes(s), p) for s, p in buffer if s >= start]
    frames.append((wire.END_SEQ, b""))
    return frames
