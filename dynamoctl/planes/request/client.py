"""Request-plane client: one object, one DEALER per server address, many streams on each.

A stream is an async generator of ``bytes`` chunks. Leaving it early in any way (``break``
then garbage collection, ``aclose()``, cancellation of the consuming task) sends a Cancel so
that the server frees the engine's work; a stream that ends with End or Error needs none.

Flow control: the Request grants ``window`` chunks; as the consumer drains, the client
raises the (cumulative) credit limit once half a window has been consumed, so the
per-stream buffer never holds more than ``window`` chunks and a slow consumer suspends the
server's handler.

Heartbeats: every ``heartbeat_interval`` the client pings each connected server. A stream
fails with :class:`PeerDeadError` when its server has sent nothing for
``heartbeat_timeout`` (counted from the later of the server's last message and the
stream's start). Streams that have received nothing for an interval re-send their Credit as
a probe: a server that lost the stream (restart, message lost on reconnect) answers
UNKNOWN_STREAM, so no stream waits forever on a server that is alive but forgot it.

Dead peers (docs/planes.md): a socket monitor per connection (:mod:`.peers`) sees the
server's TCP connection close the moment its process dies; the open streams fail with
:class:`PeerDeadError` at once instead of after ``heartbeat_timeout``, the address is
reported down (:meth:`RequestClient.peer_down`, for pickers to skip) and new streams to
it fail at once, until a server answers there again. A server that is there but silent
(its process frozen: SIGSTOP, a deadlock; the TCP connection stays open) is reported down
the same way once it has sent nothing for ``heartbeat_timeout``, until it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import cast

import zmq
import zmq.asyncio

from dynamoctl import wire
from dynamoctl.planes import _zmq
from dynamoctl.planes.request.errors import (
    ClientClosedError,
    PeerDeadError,
    RequestPlaneError,
    from_code,
)
from dynamoctl.planes.request.peers import PeerState, PeerWatch
from dynamoctl.util.aio import AsyncService

logger = logging.getLogger(__name__)

_END = object()  # marks a stream the server ended normally


class StreamProbe:
    """A window on one stream's buffer for its consumer (see :meth:`RequestClient.stream`):
    how many chunks have arrived and not been taken yet. A consumer that writes each chunk
    somewhere (an HTTP response) can hold its writes while more are already here and send
    them in one go, which under load saves a syscall per chunk."""

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream: _Stream | None = None

    def buffered(self) -> int:
        """Chunks received and not yet consumed (0 before the stream opens)."""
        stream = self._stream
        return 0 if stream is None else len(stream.buf)


class _Stream:
    __slots__ = (
        "buf",
        "conn",
        "consumed",
        "last_recv",
        "limit",
        "opened",
        "outcome",
        "received",
        "rid",
        "waiter",
        "window",
    )

    def __init__(self, conn: _Connection, rid: int, window: int) -> None:
        self.conn = conn
        self.rid = rid
        self.window = window
        self.buf: deque[bytes] = deque()
        self.received = 0  # seq of the next chunk
        self.consumed = 0
        self.limit = window  # credit limit granted to the server
        self.outcome: object | BaseException | None = None  # _END or the failure
        self.waiter: asyncio.Future[None] | None = None
        self.opened = self.last_recv = time.monotonic()

    def feed(self, msg: wire.Chunk | wire.End | wire.Error) -> None:
        if self.outcome is not None:
            return
        if isinstance(msg, wire.Chunk):
            if msg.seq != self.received or len(self.buf) >= self.window:
                why = f"chunk {msg.seq} while expecting {self.received} (window {self.window})"
                self.fail(PeerDeadError(f"stream {self.rid} broke in transit: {why}"))
                return
            self.buf.append(msg.data)
            self.received += 1
        elif isinstance(msg, wire.End):
            self.outcome = _END
        else:
            self.outcome = from_code(msg.code, msg.message)
        self.last_recv = time.monotonic()
        self._wake()

    def abandon(self) -> None:
        """The consumer is done with the stream: forget it, and cancel it on the server
        unless the server already finished it."""
        if self.conn.streams.pop(self.rid, None) is not None and not _server_ended(self.outcome):
            self.conn.post(wire.Cancel(self.rid))

    def fail(self, exc: BaseException) -> None:
        if self.outcome is None:
            self.outcome = exc
            self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next(self) -> bytes | None:
        """The next chunk, None at End; raises the stream's failure."""
        while not self.buf:
            if not await self._arrival():
                return None
        self._consumed(1)
        return self.buf.popleft()

    async def next_run(self) -> list[bytes] | None:
        """Every chunk buffered now (at least one, in order), None at End; raises the
        stream's failure."""
        while not self.buf:
            if not await self._arrival():
                return None
        run = list(self.buf)
        self.buf.clear()
        self._consumed(len(run))
        return run

    async def _arrival(self) -> bool:
        """Wait for a chunk or the outcome: False at End; raises the stream's failure."""
        if self.outcome is _END:
            return False
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        return True

    def _consumed(self, count: int) -> None:
        """Count chunks taken; raise the credit once half a window has been taken."""
        self.consumed += count
        if self.consumed + self.window - self.limit >= max(1, self.window // 2):
            self.limit = self.consumed + self.window
            self.conn.post(wire.Credit(self.rid, self.limit))


class _Owner:
    """The task that iterates a stream: its cancellation cancels the stream. Followed from
    step to step, since ``wait_for(anext(s))`` runs each step in a task of its own."""

    __slots__ = ("stream", "task")

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.task: asyncio.Task[object] | None = None

    def adopt(self) -> None:
        task = asyncio.current_task()
        if task is not self.task:
            self.release()
            self.task = task
            if task is not None:
                task.add_done_callback(self._done)

    def release(self) -> None:
        if self.task is not None:
            self.task.remove_done_callback(self._done)

    def _done(self, task: asyncio.Future[object]) -> None:
        # Only cancellation: reading task.exception() would hide it from its owner.
        if task.cancelled():
            stream = self.stream
            stream.abandon()
            stream.fail(ClientClosedError(f"task iterating stream {stream.rid} cancelled"))


class _Connection:
    """One DEALER to one server address, pumped by the event loop.

    The socket is a plain (not asyncio) ZeroMQ socket: its file descriptor is watched with
    ``add_reader`` and every wake-up drains whatever has arrived with non-blocking
    ``recv`` calls, where ``zmq.asyncio`` would make a future, a callback and several
    option reads per message - most of a frontend's request-plane cost at 16 messages
    per streamed request. ZeroMQ's descriptor is edge-triggered and a send may consume
    its signal, so each pump ends by reading ``EVENTS`` and runs again if work is left.
    """

    def __init__(self, address: str, identity: bytes, on_peer: Callable[[str, bool], None]) -> None:
        self.address = address
        self._on_peer = on_peer
        self.sock = _zmq.sync_context().socket(zmq.DEALER)
        _zmq.secure_client(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        # Our own identity, stable across TCP reconnects, so the server's routes survive.
        self.sock.setsockopt(zmq.ROUTING_ID, identity)
        self.peer = PeerWatch(self.sock, self._peer_changed)  # before connect: sees it all
        self.down_since: float | None = None
        self.silent = False
        """The server has sent nothing (not even a Pong) for ``heartbeat_timeout``: frozen,
        wedged or cut off. Pickers skip it until it answers again (:meth:`_receive`)."""
        self.sock.connect(address)
        self.streams: dict[int, _Stream] = {}
        self.unanswered_since: float | None = None
        """When the oldest Ping still without any answer left for the server: silence is
        counted from there, never from the last message received nor from when the Ping
        was queued, so a stall of our own loop (no Ping sent, so none answered) is not
        taken for the server's."""
        self.blocked_since: float | None = None
        """Since when our messages wait at the high-water mark with nothing coming back
        (the server neither reads nor sends)."""
        self._out: deque[bytes] = deque()
        self._out_empty = asyncio.Event()
        self._out_empty.set()
        self._ping_queued = False
        self._pump_scheduled = False
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, self.sock.get(_FD))
        self._loop.add_reader(self._fd, self._pump)

    def _peer_changed(self, state: PeerState) -> None:
        if state is PeerState.DOWN:
            self.down_since = time.monotonic()
            failed = self.fail_open(PeerDeadError(f"{self.address} closed the connection"))
            logger.warning("request-plane peer %s is gone (%d open streams failed)",
                           self.address, failed)  # fmt: skip
        else:
            if self.down_since is not None:
                logger.info("request-plane peer %s answers again", self.address)
            self.down_since = None
        self._on_peer(self.address, state is PeerState.DOWN)

    def fail_open(self, exc: BaseException) -> int:
        """Fail every open stream with ``exc``; how many there were."""
        failed = 0
        for stream in self.streams.values():
            if stream.outcome is None:
                stream.fail(exc)
                failed += 1
        return failed

    def post(self, msg: wire.WireMessage) -> None:
        """Queue ``msg`` for sending; never blocks, so it is safe from ``finally`` blocks
        and finalizers. It goes out on the loop's next turn, with anything else posted
        meanwhile."""
        if not self.closed:
            self._out.append(wire.encode(msg))
            self._out_empty.clear()
            self._schedule()

    def ping(self) -> None:
        if not self._ping_queued:  # a stalled connection must not pile up pings
            self._ping_queued = True
            self.post(wire.Ping())

    def silent_for(self, now: float) -> float:
        """How long a sent Ping has gone without anything from the server, or our messages
        have waited for it to read them (0: neither)."""
        since = self.unanswered_since, self.blocked_since
        return max((now - t for t in since if t is not None), default=0.0)

    def _schedule(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self.closed:
            return
        sock, out = self.sock, self._out
        try:
            while out:
                sock.send(out[0], _NOBLOCK)  # Again: at the high-water mark; wait for POLLOUT
                if out.popleft() == _PING_FRAME:
                    self._ping_queued = False
                    if self.unanswered_since is None:
                        self.unanswered_since = time.monotonic()
            self._out_empty.set()
            self.blocked_since = None
        except zmq.Again:
            if self.blocked_since is None:
                self.blocked_since = time.monotonic()
        try:
            for _ in range(_RECV_BUDGET):
                self._receive(sock.recv(_NOBLOCK))
            self._schedule()  # budget spent: let others run, then drain the rest
            return
        except zmq.Again:
            pass
        events = cast(int, sock.get(_EVENTS))
        if events & _POLLIN or (out and events & _POLLOUT):
            self._schedule()

    def _receive(self, raw: bytes) -> None:
        self.unanswered_since = self.blocked_since = None  # it answers: not silent
        if self.silent:
            self._silence_over()
        try:
            msg = wire.decode_server(raw)
        except wire.DecodeError as exc:
            logger.warning("undecodable message from %s: %s", self.address, exc)
            return
        if not isinstance(msg, wire.Pong):
            stream = self.streams.get(msg.rid)
            if stream is not None:  # else: already finished or cancelled here
                stream.feed(msg)

    def _silence_over(self) -> None:
        self.silent = False
        logger.info("request-plane peer %s answers again", self.address)
        self._on_peer(self.address, self.peer.state is PeerState.DOWN)

    def check(self, now: float, interval: float, timeout: float) -> None:
        """Heartbeat tick: ping, fail streams on a silent server, probe quiet streams; a
        server silent for ``timeout`` is reported down until it answers again."""
        self._pump()  # read what has arrived first: answers that came during our own stall
        silent_for = self.silent_for(now)
        self.ping()
        if not self.silent and silent_for > timeout and self.peer.state is not PeerState.DOWN:
            self.silent = True
            logger.warning(
                "request-plane peer %s sent nothing for %.1fs (heartbeat_timeout %gs): "
                "skipped until it answers again", self.address, silent_for, timeout,
            )  # fmt: skip
            self._on_peer(self.address, True)
        for stream in self.streams.values():
            if stream.outcome is not None:
                continue
            silent = min(silent_for, now - stream.opened)
            if silent > timeout:
                why = f"sent nothing for {silent:.1f}s (heartbeat_timeout {timeout}s)"
                stream.fail(PeerDeadError(f"{self.address} {why}"))
            elif now - stream.last_recv >= interval:
                self.post(wire.Credit(stream.rid, stream.limit))

    async def close(self, exc: BaseException) -> None:
        """Cancel open streams on the server (best effort: a short flush, then linger 0;
        the server's heartbeat timeout is the backstop) and fail them here."""
        for stream in self.streams.values():
            if stream.outcome is None:
                self.post(wire.Cancel(stream.rid))
                stream.fail(exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._out_empty.wait(), 0.1)
        self.closed = True
        self._loop.remove_reader(self._fd)
        self.peer.close()
        _zmq.close(self.sock)


_FD, _EVENTS = int(zmq.FD), int(zmq.EVENTS)
_POLLIN, _POLLOUT, _NOBLOCK = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.NOBLOCK)
_RECV_BUDGET = 256
"""Messages one pump may handle before yielding to the loop."""
_PING_FRAME = wire.encode(wire.Ping())


class RequestClient(AsyncService):
    """Open streams to request-plane servers; connects to each address on first use."""

    def __init__(
        self,
        *,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 3.0,
        window: int = 64,
        forget_down_after: float = 300.0,
    ) -> None:
        # A server cancels a silent client's streams after its own bound: a long timeout
        # here (the frontend's --stream-silence-timeout) must not space pings past it.
        self.heartbeat_interval = min(heartbeat_interval, wire.SERVER_HEARTBEAT_TIMEOUT / 4)
        """Seconds between pings to each connected server (at most a quarter of the
        servers' :data:`~dynamoctl.wire.planes.SERVER_HEARTBEAT_TIMEOUT`)."""
        self.heartbeat_timeout = heartbeat_timeout
        """Seconds of server silence after which its open streams fail with PeerDeadError."""
        self.window = window
        """Default per-stream credit window in chunks (bounds each stream's buffer)."""
        self.forget_down_after = forget_down_after
        """Seconds after which a connection whose server went away, with no stream left,
        is closed (ZeroMQ would otherwise retry the dead address forever)."""
        self.peer_listeners: list[Callable[[str, bool], None]] = []
        """Called with ``(address, down)`` whenever :meth:`peer_down` changes: a server's
        connection dropped, came back, or was forgotten after ``forget_down_after``."""
        self._identity = os.urandom(16)
        self._conns: dict[str, _Connection] = {}
        self._rids = itertools.count(1)
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False

    async def connect(self, address: str) -> None:
        """Connect ahead of the first stream (optional: :meth:`stream` connects too)."""
        self._connection(address)

    def addresses(self) -> list[str]:
        """The server addresses this client has a connection to now."""
        return list(self._conns)

    def peer_down(self, address: str) -> bool:
        """Whether the server at ``address`` dropped its connection (its process died or
        is restarting) or has sent nothing, not even a heartbeat's answer, for
        ``heartbeat_timeout`` (frozen, wedged), and has not answered since: pick another."""
        conn = self._conns.get(address)
        return conn is not None and (conn.peer.state is PeerState.DOWN or conn.silent)

    def peer_silent(self, address: str) -> bool:
        """Whether the server at ``address`` is connected but has left a heartbeat
        unanswered for ``heartbeat_timeout`` (frozen, or only stalled: it may answer)."""
        conn = self._conns.get(address)
        return conn is not None and conn.silent and conn.peer.state is not PeerState.DOWN

    async def disconnect(self, address: str) -> None:
        """Close the connection to ``address``; its open streams fail with
        :class:`ClientClosedError`."""
        conn = self._conns.pop(address, None)
        if conn is not None:
            await self._close_conn(conn)

    async def stream(
        self,
        address: str,
        endpoint: str,
        body: bytes,
        *,
        window: int | None = None,
        probe: StreamProbe | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Call ``endpoint`` on the server at ``address``; yields its chunks.

        Raises :class:`RemoteError`, :class:`UnknownEndpointError`, :class:`Overloaded`,
        :class:`PeerDeadError` or :class:`ClientClosedError` (all
        :class:`RequestPlaneError`). The request is sent on the first iteration.

        Leaving early cancels the stream on the server: at once on ``aclose()`` (use
        ``contextlib.aclosing``) or when the task iterating it is cancelled, even while
        it awaits something else; after a plain ``break``, when the generator is garbage
        collected (immediately in CPython unless something still references it).

        ``probe``, if given, is attached to this stream (see :class:`StreamProbe`).
        """
        stream = self._open(address, endpoint, body, window, probe)
        owner = _Owner(stream)
        try:
            owner.adopt()
            while (chunk := await stream.next()) is not None:
                yield chunk
                owner.adopt()
        finally:
            owner.release()
            stream.abandon()

    async def stream_runs(
        self,
        address: str,
        endpoint: str,
        body: bytes,
        *,
        window: int | None = None,
        probe: StreamProbe | None = None,
    ) -> AsyncGenerator[list[bytes], None]:
        """:meth:`stream`, but each step yields every chunk that has arrived since the
        last (at least one): a consumer that falls behind handles a run of chunks in one
        wake-up instead of one per chunk. Same errors and cancellation."""
        stream = self._open(address, endpoint, body, window, probe)
        owner = _Owner(stream)
        try:
            owner.adopt()
            while (run := await stream.next_run()) is not None:
                yield run
                owner.adopt()
        finally:
            owner.release()
            stream.abandon()

    def _open(
        self,
        address: str,
        endpoint: str,
        body: bytes,
        window: int | None,
        probe: StreamProbe | None,
    ) -> _Stream:
        """A new stream to ``address``, its Request posted."""
        conn = self._connection(address)
        if conn.peer.state is PeerState.DOWN:
            raise PeerDeadError(f"{address} closed the connection and has not come back")
        stream = _Stream(conn, next(self._rids), window or self.window)
        if probe is not None:
            probe._stream = stream
        conn.streams[stream.rid] = stream
        conn.post(wire.Request(stream.rid, endpoint, body, stream.window))
        return stream

    async def close(self) -> None:
        """Fail open streams with :class:`ClientClosedError` and close every socket."""
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await self._close_conn(conn)

    # ------------------------------------------------------------------ internals

    def _connection(self, address: str) -> _Connection:
        if self._closed:
            raise ClientClosedError("RequestClient is closed")
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = _Connection(address, self._identity, self._peer)
            if self._heartbeat is None:
                self._heartbeat = asyncio.create_task(self._heartbeats(), name="heartbeats")
        return conn

    def _peer(self, address: str, down: bool) -> None:
        for listener in self.peer_listeners:
            listener(address, down)

    async def _close_conn(self, conn: _Connection) -> None:
        await conn.close(ClientClosedError(f"connection to {conn.address} closed"))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                down = conn.down_since
                if down is not None and not conn.streams and now - down > self.forget_down_after:
                    await self.disconnect(conn.address)
                    self._peer(conn.address, False)
                else:
                    conn.check(now, self.heartbeat_interval, self.heartbeat_timeout)


def _server_ended(outcome: object) -> bool:
    """Whether the server itself finished the stream (End, or an Error it sent)."""
    if outcome is None:
        return False
    if outcome is _END:
        return True
    return isinstance(outcome, RequestPlaneError) and not isinstance(
        outcome, PeerDeadError | ClientClosedError
    )
