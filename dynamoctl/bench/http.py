"""A minimal asyncio HTTP/1.1 client for streamed (SSE) POSTs, one connection per request.

Why not httpx: it writes the request head and body separately, and on Linux loopback the
second write waits for the peer's delayed ACK (~40 ms per request), so a benchmark would
measure the client instead of the server. Here the head and body leave in one ``write``
(asyncio sets TCP_NODELAY) and the response is parsed with no per-chunk allocation beyond
the bytes themselves. Supports ``Content-Length``, chunked and read-until-close bodies, and
https. docs/benchmarks.md compares it with httpx and aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
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


class Endpoint:
    """Where requests go: ``http[s]://host:port`` plus an optional path prefix."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.base_url = f"{parts.scheme}://{parts.netloc}{self.prefix}"
        self._ssl = ssl.create_default_context() if self.tls else None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=1 << 20)
        except OSError as exc:
            raise ConnectError(f"{self.host}:{self.port}: {exc}") from exc

    def request_head(self, method: str, path: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += ["Connection: close", f"Content-Length: {length}", "", ""]
        return "\r\n".join(lines).encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
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
            if size == 0:
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
    else:
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
) -> AsyncIterator[bytes]:
    """POST ``payload`` (JSON) and yield each SSE event's data until the stream ends.

    Raises :class:`HttpStatusError` for a non-200 answer (with its body),
    :class:`ConnectError` when no connection opens, OSError when it breaks,
    :class:`ProtocolError` for unreadable or cut responses.
    """
    sent = {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})}
    reader, writer = await endpoint.open()
    try:
        writer.write(endpoint.request_head("POST", path, len(payload), sent) + payload)
        status, response_headers = await _read_head(reader)
        body = _body(reader, response_headers)
        if status != 200:
            raw = b""
            async for part in body:
                raw += part
                if len(raw) > MAX_ERROR_BODY:
                    break
            raise HttpStatusError(status, raw.decode("utf-8", "replace"))
        async for event in _sse_events(body):
            yield event
    finally:
        writer.close()


async def get_json_bytes(endpoint: Endpoint, path: str) -> tuple[int, bytes]:
    """A GET (e.g. ``/v1/models``): status and the whole body."""
    reader, writer = await endpoint.open()
    try:
        writer.write(endpoint.request_head("GET", path, 0, {"Accept": "application/json"}))
        status, headers = await _read_head(reader)
        return status, b"".join([part async for part in _body(reader, headers)])
    finally:
        writer.close()
