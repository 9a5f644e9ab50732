"""A minimal asyncio HTTP/1.1 client for streamed (SSE) POSTs, with keep-alive.

Why not httpx: it writes the request head and body separately, and on Linux loopback the
second write waits for the peer's delayed ACK (~40 ms per request), so a benchmark would
measure the client instead of the server. Here the head and body leave in one ``write``
(asyncio sets TCP_NODELAY) and the response is parsed with no per-chunk allocation beyond
the bytes themselves. Supports ``Content-Length``, chunked and read-until-close bodies, and
https. docs/benchmarks.md compares it with httpx and aiohttp.

Connections are kept alive: each :class:`Endpoint` holds the idle ones, and a request
takes one (or opens one), so a closed loop of N sessions settles on N connections, the
way a pooled client or a browser behaves. A connection goes back only after its response
was read to the end; one the server closed while idle is retried once on a new connection
when no byte of the answer arrived (the server cannot have acted on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_ERROR_BODY = 64 * 1024


class HttpStatusError(Exception):
    """The server answered with a status other than 200."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body[:200]}")


class ProtocolError(Exception):
    """The response is not HTTP/1.x we can read."""


class ConnectError(OSError):
    """The connection could not be opened (refused, unreachable, TLS handshake)."""


class ResponseCut(ProtocolError):
    """The connection closed before the response's end."""


class _Stale(ResponseCut):
    """A reused connection was closed by the server before any byte of the answer."""


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        self.writer.close()

    @property
    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()


class Endpoint:
    """Where requests go: ``http[s]://host:port`` plus an optional path prefix, and the
    idle keep-alive connections to it (``keep_alive=False``: a new connection each)."""

    def __init__(self, base_url: str, keep_alive: bool = True) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.base_url = f"{parts.scheme}://{parts.netloc}{self.prefix}"
        self._ssl = ssl.create_default_context() if self.tls else None
        self.keep_alive = keep_alive
        self.opened = 0
        """Connections opened so far (reports and tests: reuse means opened << requests)."""
        self._idle: list[Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> Connection:
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self._ssl, limit=1 << 20
            )
        except OSError as exc:
            raise ConnectError(f"{self.host}:{self.port}: {exc}") from exc
        self.opened += 1
        return Connection(reader, writer)

    def _take(self) -> Connection | None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._idle, self._loop = [], loop
        while self._idle:
            conn = self._idle.pop()  # the most recently used: least likely timed out
            if conn.usable:
                conn.reused = True
                return conn
            conn.close()
        return None

    def release(self, conn: Connection, reusable: bool) -> None:
        """Keep ``conn`` for the next request when its response was read to the end."""
        if reusable and self.keep_alive and conn.usable:
            self._idle.append(conn)
        else:
            conn.close()

    async def exchange(self, data: bytes) -> tuple[Connection, int, dict[str, str]]:
        """Send one request (head and body in ``data``) and read the answer's head; the
        caller reads the body, then gives the connection to :meth:`release`."""
        while True:
            conn = self._take() or await self.open()
            try:
                conn.writer.write(data)
                status, headers = await _read_head(conn.reader, conn.reused)
                return conn, status, headers
            except (_Stale, ConnectionResetError, BrokenPipeError):
                conn.close()
                if not conn.reused:  # a fresh connection failing is the server's answer
                    raise
            except BaseException:
                conn.close()
                raise

    async def close(self) -> None:
        """Close the idle connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await conn.writer.wait_closed()

    def request_head(self, method: str, path: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if not self.keep_alive:
            lines.append("Connection: close")
        lines += [f"Content-Length: {length}", "", ""]
        return "\r\n".join(lines).encode("latin-1")


def _keeps_alive(status_line: bytes, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    if status_line.startswith(b"HTTP/1.0"):
        return "keep-alive" in connection
    return "close" not in connection


async def _read_head(
    reader: asyncio.StreamReader, reused: bool = False
) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names); the pseudo-header ``:keep-alive`` is
    non-empty when the connection may carry another request."""
    status_line = await reader.readline()
    if not status_line and reused:
        raise _Stale("a kept-alive connection was closed by the server")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            headers[":keep-alive"] = "1" if _keeps_alive(status_line, headers) else ""
            return int(parts[1]), headers
        if not line:
            raise ResponseCut("connection closed in the response head")
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives, de-chunked."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ResponseCut("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:  # then trailers, if any, up to an empty line
                while (line := await reader.readline()) not in (b"\r\n", b"\n"):
                    if not line:
                        raise ResponseCut("connection closed in the trailers")
                return
            try:
                data = await reader.readexactly(size + 2)  # chunk + CRLF
            except asyncio.IncompleteReadError as exc:
                raise ResponseCut("connection closed inside a chunk") from exc
            yield data[:-2]
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                raise ResponseCut("connection closed before Content-Length bytes")
            left -= len(data)
            yield data
    else:  # read until close: the connection cannot be reused
        headers[":keep-alive"] = ""
        while data := await reader.read(1 << 16):
            yield data


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event (multi-line data joined by newlines)."""
    buffer = b""
    data: list[bytes] = []
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if data:
                    yield b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
    if buffer.startswith(b"data:"):
        data.append(buffer[5:].strip())
    if data:
        yield b"\n".join(data)


async def post_sse(
    endpoint: Endpoint, path: str, payload: bytes, headers: dict[str, str] | None = None
) -> AsyncGenerator[bytes, None]:
    """POST ``payload`` (JSON) and yield each SSE event's data until the stream ends.

    Read it to its end (past ``[DONE]``) for the connection to be reused; leaving early
    closes it. Raises :class:`HttpStatusError` for a non-200 answer (with its body),
    :class:`ConnectError` when no connection opens, OSError when it breaks,
    :class:`ProtocolError` for unreadable or cut responses.
    """
    sent = {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})}
    head = endpoint.request_head("POST", path, len(payload), sent)
    conn, status, response_headers = await endpoint.exchange(head + payload)
    complete = False
    try:
        body = _body(conn.reader, response_headers)
        if status != 200:
            raw = b""
            complete = True
            async for part in body:
                raw += part
                if len(raw) > MAX_ERROR_BODY:
                    complete = False
                    break
            raise HttpStatusError(status, raw.decode("utf-8", "replace"))
        async for event in _sse_events(body):
            yield event
        complete = True
    finally:
        endpoint.release(conn, complete and bool(response_headers[":keep-alive"]))


async def get_json_bytes(
    endpoint: Endpoint, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """A GET (e.g. ``/v1/models``): status and the whole body."""
    head = endpoint.request_head("GET", path, 0, {"Accept": "application/json", **(headers or {})})
    conn, status, headers = await endpoint.exchange(head)
    complete = False
    try:
        body = b"".join([part async for part in _body(conn.reader, headers)])
        complete = True
        return status, body
    finally:
        endpoint.release(conn, complete and bool(headers[":keep-alive"]))
