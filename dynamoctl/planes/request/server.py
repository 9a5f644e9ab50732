"""Request-plane server: a worker binds one ROUTER and serves named streaming endpoints.

Per request the server runs the endpoint's handler (an async generator yielding ``bytes``)
in its own task, the *pump*, which sends each chunk only while the client has granted
credit; without credit the pump stops pulling from the handler, so the handler sits
suspended at its ``yield`` and a slow consumer slows the engine instead of filling memory.

Cancellation always reaches the handler as :class:`asyncio.CancelledError`, whether it was
running (the task is cancelled) or parked at ``yield`` waiting for credit (thrown in with
``athrow``), so an engine adapter aborts its request in one ``except``/``finally``.
Causes: the client's Cancel, the client going silent for ``heartbeat_timeout``, the client
becoming unreachable (``ROUTER_MANDATORY`` turns a send to a vanished peer into an error
instead of a silent drop), and :meth:`RequestServer.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import cast

import zmq

from dynamoctl import wire
from dynamoctl.planes import _zmq
from dynamoctl.planes.request.errors import NotAccepting
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import ErrorCode

logger = logging.getLogger(__name__)

Handler = Callable[[bytes], AsyncIterator[bytes]]
"""An endpoint: called with the request body, yields the response chunks."""


class _PeerGone(Exception):
    """A send to a client failed because ZeroMQ no longer has a route to it."""


@dataclass(eq=False)
class _Stream:
    rid: int
    limit: int  # chunks [0, limit) may be sent; raised by Credit
    sent: int = 0
    credit: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Peer:
    ident: bytes
    last_seen: float
    streams: dict[int, _Stream] = field(default_factory=dict)


class RequestServer(AsyncService):
    """Serve named streaming endpoints on one ROUTER socket.

    ``address`` may be ``tcp://host:0`` (ephemeral port; read :attr:`address` after
    :meth:`start`) or ``ipc://path``.
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:0",
        *,
        max_inflight: int = 1024,
        heartbeat_timeout: float = wire.SERVER_HEARTBEAT_TIMEOUT,
    ) -> None:
        self._bind_address = address
        self.max_inflight = max_inflight
        """Streams running at once; one more is refused with ``Overloaded``."""
        self.heartbeat_timeout = heartbeat_timeout
        """Seconds of silence after which a client's handlers are cancelled. Keep it at
        least the clients' ``heartbeat_timeout``."""
        self._handlers: dict[str, Handler] = {}
        self._peers: dict[bytes, _Peer] = {}
        self._inflight = 0
        self._sock: zmq.Socket[bytes] | None = None
        self._fd = -1
        self._check_scheduled = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._address = ""

    # ------------------------------------------------------------------ public API

    def register(self, endpoint: str, handler: Handler) -> None:
        """Serve ``handler`` under ``endpoint`` (may be called before or after start)."""
        self._handlers[endpoint] = handler

    @property
    def address(self) -> str:
        """The bound address with the real port, once started."""
        if not self._address:
            raise RuntimeError("RequestServer.address is known only after start()")
        return self._address

    @property
    def inflight(self) -> int:
        """Streams currently running."""
        return self._inflight

    async def start(self) -> None:
        self._closing = False
        sock = _zmq.sync_context().socket(zmq.ROUTER)
        _zmq.secure_server(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Clients set their own identity; a reconnecting client takes its old route over.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # Unbounded send queue: credits already bound what a client can have queued, and a
        # send can then never block (EAGAIN), so it is a plain non-blocking call.
        sock.setsockopt(zmq.SNDHWM, 0)
        self._address = await _zmq.bind(sock, self._bind_address)
        self._sock = sock
        self._fd = cast(int, sock.get(_FD))
        asyncio.get_running_loop().add_reader(self._fd, self._receive)
        self._check_later()  # messages may have queued while binding
        self._tasks = [
            asyncio.create_task(self._reaper(), name=f"request-server-reaper {self._address}"),
        ]
        logger.info("request plane serving on %s", self._address)

    async def close(self) -> None:
        """Stop receiving, cancel every handler and close the socket."""
        if self._sock is not None:  # first: no request may open while handlers are cancelled
            asyncio.get_running_loop().remove_reader(self._fd)
        self._closing = True
        streams = [s for p in self._peers.values() for s in p.streams.values() if s.task]
        tasks = [*self._tasks, *(s.task for s in streams if s.task)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._peers.clear()
        _zmq.close(self._sock)
        self._sock = None

    # ------------------------------------------------------------------ receiving

    def _receive(self) -> None:
        """Drain what has arrived (the socket's descriptor woke the loop, or a send may
        have consumed its edge-triggered signal: see :meth:`_check_later`)."""
        self._check_scheduled = False
        sock = self._sock
        if sock is None or self._closing:
            return
        try:
            for _ in range(_RECV_BUDGET):
                self._handle(sock.recv_multipart(_NOBLOCK))
            self._check_later()  # budget spent: let the pumps run, then drain the rest
            return
        except zmq.Again:
            pass
        if cast(int, sock.get(_EVENTS)) & _POLLIN:
            self._check_later()

    def _check_later(self) -> None:
        """ZeroMQ's descriptor only signals changes, and any operation on the socket (a
        send too) may consume that signal: look at the socket again on the loop's next
        turn."""
        if not self._check_scheduled and self._sock is not None:
            self._check_scheduled = True
            asyncio.get_running_loop().call_soon(self._receive)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            logger.warning("dropping request-plane message with %d frames", len(frames))
            return
        ident, payload = frames
        try:
            msg = wire.decode_client(payload)
        except wire.DecodeError as exc:
            logger.warning("dropping undecodable request-plane message: %s", exc)
            return
        peer = self._peers.get(ident)
        if peer is None:
            peer = self._peers[ident] = _Peer(ident, time.monotonic())
        else:
            peer.last_seen = time.monotonic()
        try:
            self._dispatch(peer, msg)
        except _PeerGone:
            self._drop_peer(peer, "unreachable")
        except Exception:  # one bad message must not take the whole server down
            logger.exception("request-plane server failed on %s", type(msg).__name__)

    def _dispatch(self, peer: _Peer, msg: wire.ClientMessage) -> None:
        if isinstance(msg, wire.Credit):
            stream = peer.streams.get(msg.rid)
            if stream is None:
                # Also after a normal End crossing a probe; the client ignores it then.
                self._send_error(peer.ident, msg.rid, ErrorCode.UNKNOWN_STREAM, "")
            elif msg.limit > stream.limit:
                stream.limit = msg.limit
                stream.credit.set()
        elif isinstance(msg, wire.Cancel):
            stream = peer.streams.get(msg.rid)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        elif isinstance(msg, wire.Ping):
            self._send(peer.ident, wire.Pong())
        else:
            self._open(peer, msg)

    def _open(self, peer: _Peer, req: wire.Request) -> None:
        handler = self._handlers.get(req.endpoint)
        if handler is None:
            known = ", ".join(sorted(self._handlers)) or "none"
            text = f"unknown endpoint {req.endpoint!r} on {self._address} (known: {known})"
            self._send_error(peer.ident, req.rid, ErrorCode.UNKNOWN_ENDPOINT, text)
        elif req.rid in peer.streams or req.window < 1:
            text = f"duplicate request id {req.rid}" if req.window >= 1 else "window < 1"
            self._send_error(peer.ident, req.rid, ErrorCode.BAD_REQUEST, text)
        elif self._inflight >= self.max_inflight:
            text = f"{self._address} has {self._inflight} streams in flight (max_inflight)"
            self._send_error(peer.ident, req.rid, ErrorCode.OVERLOADED, text)
        else:
            try:
                chunks = handler(req.body)
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                self._send_error(peer.ident, req.rid, ErrorCode.HANDLER, text)
                return
            stream = _Stream(req.rid, limit=req.window)
            peer.streams[req.rid] = stream
            self._inflight += 1
            stream.task = asyncio.create_task(
                self._pump(peer, stream, chunks), name=f"pump {req.endpoint}"
            )
            # A callback rather than a ``finally``: a task cancelled before its first step
            # never enters its coroutine.
            stream.task.add_done_callback(lambda _: self._finished(peer, stream))

    def _finished(self, peer: _Peer, stream: _Stream) -> None:
        self._inflight -= 1
        if peer.streams.get(stream.rid) is stream:
            del peer.streams[stream.rid]

    # ------------------------------------------------------------------ streaming

    async def _pump(self, peer: _Peer, stream: _Stream, chunks: AsyncIterator[bytes]) -> None:
        in_handler = False  # True while the handler's own code runs (not parked at yield)
        try:
            while True:
                while stream.sent >= stream.limit:
                    stream.credit.clear()
                    await stream.credit.wait()
                in_handler = True
                try:
                    data = await anext(chunks)
                except StopAsyncIteration:
                    break
                in_handler = False
                if not isinstance(data, bytes | bytearray | memoryview):
                    raise TypeError(f"handler yielded {type(data).__name__}, not bytes")
                self._send(peer.ident, wire.Chunk(stream.rid, stream.sent, data))
                stream.sent += 1
            in_handler = False
            self._send(peer.ident, wire.End(stream.rid))
        except asyncio.CancelledError:
            if not in_handler:
                await _throw_cancel(chunks)
            raise
        except _PeerGone:
            await _throw_cancel(chunks)
            self._drop_peer(peer, "unreachable")
        except Exception as exc:
            if not in_handler:  # our own failure (encoding, socket), not the handler's
                await _throw_cancel(chunks)
            if not isinstance(exc, NotAccepting):
                logger.warning("handler for request %d failed", stream.rid, exc_info=True)
            refused = isinstance(exc, NotAccepting) and stream.sent == 0
            code = ErrorCode.OVERLOADED if refused else ErrorCode.HANDLER
            with contextlib.suppress(_PeerGone, zmq.ZMQError):
                text = f"{type(exc).__name__}: {exc}"
                self._send_error(peer.ident, stream.rid, code, text)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _send(self, ident: bytes, msg: wire.WireMessage) -> None:
        """Send at once (never blocks: the send queue is unbounded)."""
        sock = self._sock
        if sock is None:
            raise zmq.ZMQError(zmq.ENOTSOCK, "request server closed")
        data = wire.encode(msg)  # first: a failure between the two frames would misroute
        try:
            sock.send(ident, _SNDMORE_NOBLOCK)
            sock.send(data, _NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise _PeerGone from exc
            raise
        finally:
            self._check_later()

    def _send_error(self, ident: bytes, rid: int, code: ErrorCode, text: str) -> None:
        self._send(ident, wire.Error(rid, code, text))

    # ------------------------------------------------------------------ liveness

    async def _reaper(self) -> None:
        """Cancel the handlers of clients silent for longer than the heartbeat timeout."""
        while True:
            await asyncio.sleep(self.heartbeat_timeout / 4)
            deadline = time.monotonic() - self.heartbeat_timeout
            for peer in [p for p in self._peers.values() if p.last_seen < deadline]:
                self._drop_peer(peer, "silent for more than heartbeat_timeout")

    def _drop_peer(self, peer: _Peer, why: str) -> None:
        if self._peers.get(peer.ident) is peer:
            del self._peers[peer.ident]
        if peer.streams:
            logger.warning(
                "client %s %s: cancelling %d streams", peer.ident.hex(), why, len(peer.streams)
            )
        for stream in peer.streams.values():
            if stream.task is not None:
                stream.task.cancel()


_FD, _EVENTS, _POLLIN = int(zmq.FD), int(zmq.EVENTS), int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_RECV_BUDGET = 256
"""Messages one wake-up handles before the loop runs anything else."""


async def _throw_cancel(chunks: AsyncIterator[bytes]) -> None:
    """Deliver CancelledError at the handler's ``yield``, where it is parked."""
    athrow = getattr(chunks, "athrow", None)
    if athrow is None:
        return
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await athrow(asyncio.CancelledError())
