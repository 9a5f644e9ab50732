"""HTTP/1.1 over a bare socket, for what httpx will not send (20,000 headers, a request
trickled a byte at a time) and to see exactly when the server closes the connection."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool
    """The server closed the connection after the reply (EOF or reset)."""

    def json(self) -> Any:
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def request(
    method: str, path: str, body: bytes = b"", headers: list[tuple[str, str]] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if body or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_reply(
    reader: asyncio.StreamReader, timeout: float, head_only: bool, linger: float
) -> Reply:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
    if head_only:
        body = b""
    elif "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout)
    else:  # chunked: good enough for the short replies these tests read
        body = b""
        while True:
            size = int((await asyncio.wait_for(reader.readline(), timeout)).strip(), 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), timeout)
            if size == 0:
                break
            body += chunk[:-2]
    try:
        closed = await asyncio.wait_for(reader.read(1), linger) == b""
    except TimeoutError:
        closed = False
    except ConnectionError:
        closed = True
    return Reply(int(status_line.split()[1]), headers, body, closed)


async def exchange(url: str, data: bytes, timeout: float = 30, linger: float = 0.5) -> Reply:
    """Send ``data`` on a fresh connection and read one reply, then wait up to ``linger``
    seconds to see whether the server closes the connection."""
    reader, writer = await asyncio.open_connection(*address(url))
    try:
        writer.write(data)
        await writer.drain()
        return await _read_reply(reader, timeout, data.startswith(b"HEAD "), linger)
    finally:
        writer.close()


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float | None:
    """Seconds until the server closes the connection (reading and discarding whatever it
    says first), or None if it is still open after ``limit``."""
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            left = limit - (time.monotonic() - start)
            if not await asyncio.wait_for(reader.read(65536), max(left, 0.01)):
                return time.monotonic() - start
    except TimeoutError:
        return None
    except ConnectionError:
        return time.monotonic() - start
    return None
