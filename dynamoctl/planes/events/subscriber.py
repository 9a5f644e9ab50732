"""Event subscriber: follows many publishers, yields one ordered, gap-checked stream.

Per publisher a task owns a SUB socket (frames do not name their publisher, so one SUB per
publisher), a DEALER to its replay socket, and a :class:`StreamTracker`. Items go to one
bounded queue: a consumer that falls behind stalls the tasks, the SUB high-water marks
fill, ZeroMQ drops, and the trackers recover by replay. Memory stays bounded and nothing
diverges silently.

The sockets are plain (not asyncio) ZeroMQ sockets read without blocking; a task waits on
their file descriptors with ``add_reader``, as the request client does. A
``zmq.asyncio.Poller`` made futures, registered and unregistered every descriptor and
read several options at each wake-up, and a router wakes for each request's KV events:
without it a third less CPU per event (benchmarks/results/event_subscriber.json).
ZeroMQ's descriptor is edge-triggered:
before each wait the task reads every socket's ``EVENTS`` (which re-arms it) and waits
only if none has a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import cast

import zmq

from dynamoctl import wire
from dynamoctl.planes import _zmq
from dynamoctl.planes.events.tracker import Event, Item, Lost, Snapshot, StreamTracker
from dynamoctl.util.aio import AsyncService
from dynamoctl.util.backoff import Backoff

logger = logging.getLogger(__name__)

_BATCH = 256  # messages drained per socket per wake-up, for fairness between sockets


@dataclass
class SourceStats:
    """Counters of one publisher, for metrics and tests."""

    received_live: int = 0
    """Messages read from the SUB socket."""
    received_replay: int = 0
    """Entries read from replay answers (anchors and duplicates included)."""
    events: int = 0
    snapshots: int = 0
    lost: int = 0
    replays: int = 0
    """Replay requests sent (idle polls included)."""
    replay_timeouts: int = 0


class _Source:
    def __init__(
        self, publisher_id: str, address: str, replay_address: str | None, curve: bool
    ) -> None:
        self.publisher_id = publisher_id
        self.curve = curve
        """Connect with the deployment's CURVE key, when it has one (not to an engine's own
        publisher, which cannot speak CURVE)."""
        self.address = address
        self.replay_address = replay_address
        self.tracker = StreamTracker(publisher_id)
        self.stats = SourceStats()
        self.sub: zmq.Socket[bytes] | None = None
        self.monitor: zmq.Socket[bytes] | None = None  # SUB connection events
        self.replay: zmq.Socket[bytes] | None = None
        self.task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: set[int] = set()
        """Descriptors this source's task waits on (in ``_loop``, the task's)."""
        # Replay timers: when the next frame is due, when to re-send, attempts so far.
        self.deadline: float | None = None
        self.resend_at: float | None = None
        self.attempts = 0
        self.backoff = Backoff(base=0.1, cap=2.0)

    def watch(self, sock: zmq.Socket[bytes]) -> None:
        self._loop = asyncio.get_running_loop()
        fd = cast(int, sock.get(_FD))
        self._loop.add_reader(fd, self._wake)
        self._watched.add(fd)

    def unwatch(self, sock: zmq.Socket[bytes] | None) -> None:
        if sock is None or sock.closed:
            return
        fd = cast(int, sock.get(_FD))
        if fd in self._watched and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(fd)
        self._watched.discard(fd)

    def ready(self) -> bool:
        """Whether a socket has a message; reading ``EVENTS`` of each re-arms its
        edge-triggered descriptor, so a wait after False misses nothing."""
        return any(_readable(s) for s in (self.monitor, self.sub, self.replay) if s is not None)

    async def wait(self, timeout: float) -> None:
        """Until a socket's descriptor signals or ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        timer = loop.call_later(timeout, self._wake)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        for sock in (self.monitor, self.sub, self.replay):
            self.unwatch(sock)
        if self.sub is not None and self.monitor is not None and not self.sub.closed:
            self.sub.disable_monitor()
        _zmq.close(self.monitor)
        _zmq.close(self.sub)
        _zmq.close(self.replay)


class EventSubscriber(AsyncService):
    """Subscribe to publishers by id; iterate to get :class:`Event`, :class:`Snapshot` and
    :class:`Lost` items, in order per publisher."""

    def __init__(
        self,
        *,
        topic: bytes = b"",
        idle_poll: float = 1.0,
        replay_timeout: float = 1.0,
        replay_retries: int = 5,
        queue_size: int = 10_000,
        rcvhwm: int = 100_000,
    ) -> None:
        self.topic = topic
        """SUB prefix filter; b"" takes every topic."""
        self.idle_poll = idle_poll
        """Seconds of quiet after which the publisher's tail is checked via replay."""
        self.replay_timeout = replay_timeout
        """Seconds without any replay frame before the request is re-sent."""
        self.replay_retries = replay_retries
        """Re-sends (with backoff) before the gap is reported as Lost."""
        self.rcvhwm = rcvhwm
        """SUB high-water mark per publisher."""
        self._queue: asyncio.Queue[Item | None] = asyncio.Queue(maxsize=queue_size)
        self._sources: dict[str, _Source] = {}
        self._closed = False

    # ------------------------------------------------------------------ public API

    async def add_publisher(
        self,
        publisher_id: str,
        address: str,
        replay_address: str | None = None,
        *,
        curve: bool = True,
    ) -> None:
        """Follow a publisher. Without ``replay_address`` every gap is reported as Lost.
        ``curve=False``: a publisher that never uses CURVE (an engine's own KV events)."""
        if self._closed:
            raise RuntimeError("EventSubscriber is closed")
        if publisher_id in self._sources:
            raise ValueError(f"publisher {publisher_id!r} is already subscribed")
        source = _Source(publisher_id, address, replay_address, curve)
        self._sources[publisher_id] = source
        source.sub = _zmq.sync_context().socket(zmq.SUB)
        if curve:
            _zmq.secure_client(source.sub)
        source.sub.setsockopt(zmq.LINGER, 0)
        source.sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
        source.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        # Every (re)connection may reach a restarted publisher: the tracker must hear of it
        # before any message that came over the new connection.
        source.monitor = source.sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        source.sub.connect(address)
        source.task = asyncio.create_task(self._follow(source), name=f"events {publisher_id}")

    async def remove_publisher(self, publisher_id: str) -> None:
        source = self._sources.pop(publisher_id, None)
        if source is not None and source.task is not None:
            source.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await source.task

    def stats(self, publisher_id: str) -> SourceStats:
        return self._sources[publisher_id].stats

    async def get(self) -> Item:
        """The next item; raises :class:`StopAsyncIteration` once closed and drained."""
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def __aiter__(self) -> EventSubscriber:
        return self

    async def __anext__(self) -> Item:
        return await self.get()

    async def close(self) -> None:
        self._closed = True
        for publisher_id in list(self._sources):
            await self.remove_publisher(publisher_id)
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)  # wake a waiting consumer

    # ------------------------------------------------------------------ per publisher

    async def _follow(self, src: _Source) -> None:
        tracker, sub, monitor = src.tracker, src.sub, src.monitor
        assert sub is not None and monitor is not None
        src.watch(sub)
        src.watch(monitor)
        quiet_since = time.monotonic()
        try:
            while True:
                if not src.ready():
                    timers = (quiet_since + self.idle_poll, src.deadline, src.resend_at)
                    wake = min(t for t in timers if t is not None)
                    await src.wait(max(0.0, wake - time.monotonic()))
                else:
                    await asyncio.sleep(0)  # a busy publisher must not hold the loop
                now = time.monotonic()
                # Connection events first, whatever woke us: the I/O thread emits them
                # before any message of the connection they announce.
                while _readable(monitor):
                    monitor.recv_multipart(_NOBLOCK)
                    logger.debug("%s: connected to %s", src.publisher_id, src.address)
                    tracker.on_reconnect()
                if _readable(sub):
                    quiet_since = now
                    await self._read_live(src)
                if src.replay is not None and _readable(src.replay):
                    quiet_since = now
                    await self._read_replay(src, now)
                await self._replay_timers(src, now)
                if now - quiet_since >= self.idle_poll:
                    quiet_since = now
                    if src.replay_address is not None:
                        tracker.on_idle()
                while (start := tracker.next_replay()) is not None:
                    if src.replay_address is None:
                        await self._emit(src, tracker.on_replay_failed())
                        continue
                    if src.replay is None:
                        self._reopen_replay(src)
                    await self._send_replay(src, start, now)
        finally:
            src.close()

    async def _replay_timers(self, src: _Source, now: float) -> None:
        """Re-send a replay that went unanswered, with backoff; give up after retries."""
        if src.deadline is not None and now >= src.deadline:
            src.stats.replay_timeouts += 1
            src.deadline, src.attempts = None, src.attempts + 1
            if src.attempts > self.replay_retries:
                logger.warning(
                    "replay of %s gave no answer after %d attempts", src.publisher_id, src.attempts
                )
                src.attempts = 0
                await self._emit(src, src.tracker.on_replay_failed())
            else:
                self._reopen_replay(src)  # a late answer must not mix with the next
                src.resend_at = now + src.backoff.next()
        if src.resend_at is not None and now >= src.resend_at:
            src.resend_at = None
            await self._send_replay(src, src.tracker.retry_start(), now)

    async def _read_live(self, src: _Source) -> None:
        sub = src.sub
        assert sub is not None
        for _ in range(_BATCH):
            try:
                frames = sub.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                logger.warning("%s: dropping event with %d frames", src.publisher_id, len(frames))
                continue
            src.stats.received_live += 1
            items = src.tracker.on_live(wire.seq_from_bytes(frames[1]), frames[2])
            await self._emit(src, items)

    async def _read_replay(self, src: _Source, now: float) -> None:
        """Drain replay frames; each one proves the publisher is answering."""
        assert src.replay is not None
        tracker = src.tracker
        for _ in range(_BATCH):
            try:
                frames = src.replay.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            if frames and frames[0] == b"":
                frames = frames[1:]  # the REQ-style empty delimiter
            is_snapshot = len(frames) == 3 and frames[2] == wire.SNAPSHOT_MARKER
            if not is_snapshot and len(frames) == 3 and len(frames[1]) == 8:
                frames = frames[1:]  # vLLM >= 0.3x puts the topic before seq: [topic, seq, x]
            if is_snapshot:
                seq = wire.snapshot_seq_from_bytes(frames[0])
                await self._emit(src, tracker.on_snapshot(seq, frames[1]))
            elif len(frames) == 2 and frames[0] == wire.END_SEQ and not frames[1]:
                src.deadline, src.attempts = None, 0
                src.backoff.reset()
                await self._emit(src, tracker.on_replay_end())
                return
            elif len(frames) == 2 and len(frames[0]) == 8:
                src.stats.received_replay += 1
                seq = wire.seq_from_bytes(frames[0])
                await self._emit(src, tracker.on_replay(seq, frames[1]))
            else:
                logger.warning(
                    "%s: bad replay frame set (%d frames)", src.publisher_id, len(frames)
                )
        if tracker.replay_start is not None:
            src.deadline = now + self.replay_timeout

    def _reopen_replay(self, src: _Source) -> None:
        assert src.replay_address is not None
        if src.replay is not None:
            src.unwatch(src.replay)
            _zmq.close(src.replay)
        src.replay = _zmq.sync_context().socket(zmq.DEALER)
        if src.curve:
            _zmq.secure_client(src.replay)
        src.replay.setsockopt(zmq.LINGER, 0)
        src.replay.connect(src.replay_address)
        src.watch(src.replay)

    async def _send_replay(self, src: _Source, start: int, now: float) -> None:
        assert src.replay is not None
        src.deadline = now + self.replay_timeout
        src.stats.replays += 1
        logger.debug("%s: replay from %d", src.publisher_id, start)
        try:
            src.replay.send_multipart((b"", wire.seq_to_bytes(start)), _NOBLOCK)
        except zmq.Again:  # not connected yet, or its queue full: the deadline re-sends
            logger.debug("%s: replay request not sent now", src.publisher_id)

    async def _emit(self, src: _Source, items: list[Item]) -> None:
        for item in items:
            if isinstance(item, Event):
                src.stats.events += 1
            elif isinstance(item, Snapshot):
                src.stats.snapshots += 1
            elif isinstance(item, Lost):
                src.stats.lost += 1
                logger.warning(
                    "%s: lost events %d..%d (%s)",
                    item.publisher_id,
                    item.first_missing,
                    item.last_missing,
                    item.reason,
                )
            await self._queue.put(item)


_NOBLOCK, _EVENTS, _POLLIN, _FD = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.FD)


def _readable(sock: zmq.Socket[bytes]) -> bool:
    events = sock.get(_EVENTS)  # plain ints: pyzmq's enum flags cost more than the call
    return isinstance(events, int) and bool(events & _POLLIN)
