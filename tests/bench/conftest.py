"""A deterministic OpenAI-style streaming server whose latencies the tests know in advance."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

TTFTS_MS = (20, 60, 100, 140, 180)
"""Request number i (in arrival order) waits TTFTS_MS[i % 5] before its first token."""
ITL_MS = 10


@dataclass
class FakeServer:
    port: int = 0
    fail_every: int = 0
    """Every n-th request answers 503 (0: never)."""
    truncate_every: int = 0
    """Every n-th stream ends after its first token, without [DONE]."""
    requests: list[dict[str, object]] = field(default_factory=list)
    max_per_connection: int = 0
    """A connection answers at most this many requests; the next one on it is dropped
    unanswered, as by a server whose keep-alive timeout fired just then (0: no limit)."""
    connections: int = 0
    """Connections accepted."""
    dropped: int = 0
    """Requests dropped unanswered by ``max_per_connection``."""
    cache_block: int = 0
    """0: report half of each prompt cached. N: report what a prefix cache of N-token
    blocks that kept every earlier prompt would hold: the longest prefix, in whole
    blocks, an earlier token-id prompt shared with this one."""
    _seen: list[list[int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 with keep-alive: requests one after the other until the client closes,
        sends ``Connection: close``, or a stream is cut."""
        self.connections += 1
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                if self.max_per_connection and served >= self.max_per_connection:
                    self.dropped += 1
                    return
                served += 1
                if not await self.answer(reader, writer, head):
                    return
                await writer.drain()
                if b"connection: close" in head.lower():
                    return
        finally:
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()

    async def answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes
    ) -> bool:
        """Answer one request; False when the connection must close (a cut stream)."""
        length = 0
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        body = json.loads(await reader.readexactly(length)) if length else {}
        if head.startswith(b"GET /v1/models"):
            payload = json.dumps({"data": [{"id": "fake-model"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
            writer.write(payload)
            return True
        index = len(self.requests)
        self.requests.append(body)
        if self.fail_every and index % self.fail_every == self.fail_every - 1:
            writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy")
            return True
        return await self.stream(writer, index, body)

    async def stream(
        self, writer: asyncio.StreamWriter, index: int, body: dict[str, object]
    ) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip

        def chunk(obj: object) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            data += b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        prompt = body.get("prompt", [])
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 10
        tokens = int(body.get("max_tokens", 1))  # type: ignore[call-overload]
        cached = prompt_tokens // 2
        if self.cache_block and isinstance(prompt, list):  # cached on arrival: order decides
            cached = max((self.shared_blocks(prompt, seen) for seen in self._seen), default=0)
            self._seen.append(prompt)
        await asyncio.sleep(TTFTS_MS[index % len(TTFTS_MS)] / 1e3)
        for n in range(tokens):
            if n:
                await asyncio.sleep(ITL_MS / 1e3)
            chunk({"choices": [{"index": 0, "text": f"t{n}", "finish_reason": None}]})
            await writer.drain()
            if self.truncate_every and index % self.truncate_every == self.truncate_every - 1:
                return False  # the stream ends without [DONE]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        chunk({"choices": [], "usage": usage})
        chunk(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        return True

    def shared_blocks(self, prompt: list[int], seen: list[int]) -> int:
        """Tokens of ``prompt`` in whole blocks equal to the start of ``seen``."""
        common = 0
        for a, b in zip(prompt, seen, strict=False):
            if a != b:
                break
            common += 1
        return common - common % self.cache_block


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """Served from its own thread and event loop, so sync tests (the CLI) can use it too."""
    server = FakeServer()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        server.port = listener.sockets[0].getsockname()[1]
        started.set()
        async with listener:
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield server
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
