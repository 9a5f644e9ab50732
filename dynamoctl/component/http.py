"""Serving an ASGI app from inside a component's own event loop, with the request limits
uvicorn lacks.

uvicorn (0.54) bounds neither the time a client takes to send its headers (its
``timeout_keep_alive`` covers only the wait between requests and is reset by every byte)
nor their size or number with httptools (``h11_max_incomplete_event_size`` is h11's,
and h11 costs ~10 % of the frontend's CPU); an ASGI middleware runs only once headers are
complete, too late. :class:`GuardedHttpToolsProtocol` adds them to uvicorn's httptools
protocol through its supported extension point, ``uvicorn.Config(http=<class>)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from dynamoctl.settings.http import HttpLimitSettings

LINGER_S = 1.0
"""Closing while the client is still sending (a refused head, a body not read): how long
its input is read and dropped first. Closing with unread input makes the kernel send a
reset, which can destroy the answer before the client reads it."""
LINGER_BYTES = 16 << 20


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request over a limit."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline, a body deadline, limits on
    header bytes and fields, and a lingering close. A subclass per server sets
    :attr:`limits`."""

    limits: ClassVar[HttpLimitSettings] = HttpLimitSettings()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_head = True  # reading a request line and headers
        self._head_bytes = 0  # of the current head, as parsed
        self._head_received = 0  # bytes received since the current head began
        self._fields = 0
        self._message_done = True  # the current request has been received in full
        self._deadline: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._lingering = -1  # bytes dropped while lingering; -1: not lingering

    # -- deadlines --------------------------------------------------------------------

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if what == "body" and self.pipeline:  # queued behind a response: not read yet
            self._arm(self.limits.body_timeout, what)
        elif what == "headers" and self._idle():
            self._refuse(408, "request headers not received in time")
        else:  # the app is reading the body: it sees the client go away
            self.transport.close()

    def _idle(self) -> bool:
        """No response is being written on this connection (one may be written now)."""
        return self.cycle is None or self.cycle.response_complete

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._lingering += len(data)
            if self._lingering > LINGER_BYTES:
                self.transport.close()
            return
        if self._in_head:
            self._head_received += len(data)
        super().data_received(data)
        # The parser buffers a header line until it ends, and calls back only then: bound
        # the bytes received while the head is incomplete too, not only those parsed.
        over = self._in_head and self._head_received > self.limits.max_header_bytes
        if over and self._lingering < 0 and not self.transport.is_closing():
            self._refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error, which is what a callback's :class:`_Refused`
        becomes: answer the refusal instead."""
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._refuse(*self._refusal)

    def on_response_complete(self) -> None:
        if self._lingering < 0:  # else: no keep-alive, no next pipelined request
            super().on_response_complete()

    # -- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._message_done = False
        self._head_bytes = self._fields = 0
        self._head_received = 0
        if self._deadline is None:  # a keep-alive request: its own header deadline
            self._arm(self.limits.header_timeout, "headers")

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)
        super().on_header(name, value)

    def _count(self, size: int, fields: int) -> None:
        self._head_bytes += size
        self._fields += fields
        if self._head_bytes > self.limits.max_header_bytes:
            self._refusal = (431, f"request headers exceed {self.limits.max_header_bytes} bytes")
        elif self._fields > self.limits.max_headers:
            self._refusal = (431, f"more than {self.limits.max_headers} request headers")
        else:
            return
        raise _Refused

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._arm(self.limits.body_timeout, "body")
        super().on_headers_complete()
        if self.cycle is not None:
            # The app's response closes through us: a close while the body is still
            # coming (a 413 on its Content-Length) lingers.
            self.cycle.transport = cast(asyncio.Transport, _CycleTransport(self))

    def on_message_complete(self) -> None:
        self._message_done = True
        self._disarm()
        super().on_message_complete()

    # -- closing ------------------------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        """An OpenAI-shaped error and ``Connection: close``, then close. With a response
        of the app's being written on this connection, only the close."""
        self._disarm()
        if not self._idle():
            self.transport.close()
            return
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
        body = json.dumps({"error": error}).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.close_connection()

    def close_connection(self) -> None:
        """Close the connection; while the client may still be sending, send our end's
        EOF and read and drop its input for :data:`LINGER_S` first."""
        if self._lingering >= 0 or self.transport.is_closing():
            return
        if self._message_done:
            self.transport.close()
            return
        self._disarm()
        self._lingering = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def connection_closing(self) -> bool:
        return self._lingering >= 0 or self.transport.is_closing()


class _CycleTransport:
    """The transport as a request's response cycle sees it (it writes, closes, and asks
    whether the connection is closing): closing goes through the protocol."""

    __slots__ = ("_protocol", "write")

    def __init__(self, protocol: GuardedHttpToolsProtocol) -> None:
        self._protocol = protocol
        self.write = protocol.transport.write  # the hot path (a write per SSE chunk) as is

    def close(self) -> None:
        self._protocol.close_connection()

    def is_closing(self) -> bool:
        return self._protocol.connection_closing()


def guarded_protocol(limits: HttpLimitSettings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for a server with ``limits``."""
    return cast(
        "type[GuardedHttpToolsProtocol]",
        type("GuardedHttp", (GuardedHttpToolsProtocol,), {"limits": limits}),
    )


class BoundServer(uvicorn.Server):
    """A uvicorn server on a socket bound up front, so port 0 yields a known port, and
    without uvicorn's signal handling: the component owns SIGTERM/SIGINT (a signal means
    drain, and HTTP keeps answering meanwhile). Requests are bounded by ``limits``
    (defaults: :class:`HttpLimitSettings`). ``reuse_port``: share the port with the other
    processes of this user that ask the same (``SO_REUSEPORT``: the kernel spreads new
    connections over them), e.g. the frontend's ``frontend.processes``; each process then
    also listens on a port of its own (:attr:`own_port`), where probes and metric scrapes
    reach that process and no other."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        limits: HttpLimitSettings | None = None,
        reuse_port: bool = False,
        **config: Any,
    ) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:  # the address in the message: the error alone names none
            sock.close()
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        super().__init__(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                http=guarded_protocol(limits or HttpLimitSettings()),
                ws="none",
                **config,
            )
        )
        self.sock = sock
        self.host = host
        self.port = int(sock.getsockname()[1])
        self.sockets = [sock]
        if reuse_port:
            own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            own.bind((host, 0))
            self.sockets.append(own)
        self.own_port = int(self.sockets[-1].getsockname()[1])
        """This process's own port: :attr:`port` unless the port is shared."""

    async def run_bound(self) -> None:
        await self.serve(sockets=self.sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
