"""One measured request: send a turn, read its stream, time every content chunk.

Timing is client-side, as a user sees it: the clock starts before a connection is taken (a
kept-alive one, or a new one whose connect time then counts) and TTFT stops at the first
chunk that carries text (a chat stream's opening role-only chunk does not count). Token
counts come from the final ``usage`` chunk when the server sends one
(``stream_options.include_usage``), else one token per content chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec

from dynamoctl.bench.clock import Clock
from dynamoctl.bench.http import (
    ConnectError,
    Endpoint,
    HttpStatusError,
    ProtocolError,
    ResponseCut,
    post_sse,
)
from dynamoctl.bench.workload import Api, Conversation, dumps_body


class RequestRecord(msgspec.Struct, kw_only=True):
    """What one request did; times in seconds, ``start`` relative to the run's start."""

    session: int
    turn: int
    start: float
    ttft: float | None = None
    e2e: float | None = None
    gaps: list[float] = []
    """Times between consecutive content chunks."""
    output_tokens: int = 0
    prompt_tokens: int | None = None
    """From usage; None when the server sent none."""
    cached_tokens: int | None = None
    sent_prompt_tokens: int = 0
    """Prompt length as we built it (words in text mode)."""
    error: str | None = None
    """Kind: ``http_<status>``, ``connect`` (no connection), ``timeout``, ``incomplete``
    (cut or reset before the end), ``stream_error`` (an error event in the stream),
    ``protocol`` (unreadable); None when the request succeeded."""
    detail: str | None = None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (the request's mean ITL)."""
        if self.ttft is None or self.output_tokens < 2 or not self.gaps:
            return None
        return sum(self.gaps) / max(1, self.output_tokens - 1)


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def _text(chunk: _Chunk) -> str:
    parts = []
    for choice in chunk.choices:
        if choice.text:
            parts.append(choice.text)
        elif choice.delta is not None:
            parts.append(choice.delta.content or choice.delta.reasoning_content or "")
    return "".join(parts)


class Sender:
    """Sends turns of conversations to one OpenAI-compatible endpoint."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        clock: Clock,
        *,
        api: Api = "completions",
        timeout: float = 60.0,
        ignore_eos: bool = True,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.clock = clock
        self.api = api
        self.path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.timeout = timeout
        self.ignore_eos = ignore_eos
        self.extra_body = extra_body or {}
        self.headers = headers or {}

    async def send(self, conv: Conversation, origin: float) -> RequestRecord:
        """Play the conversation's current turn and advance it (also after a failure, so a
        session continues with a stand-in reply)."""
        body = dumps_body(conv.body(self.model, self.extra_body, self.ignore_eos))
        start = self.clock.now()
        record = RequestRecord(
            session=conv.session.id,
            turn=conv.turn,
            start=start - origin,
            sent_prompt_tokens=conv.prompt_length(),
        )
        reply: list[str] = []
        try:
            await asyncio.wait_for(self._stream(body, start, record, reply), self.timeout)
        except asyncio.TimeoutError:
            record.error, record.detail = "timeout", f"no end of stream after {self.timeout} s"
        except HttpStatusError as exc:
            record.error, record.detail = f"http_{exc.status}", exc.body[:500]
        except ConnectError as exc:
            record.error, record.detail = "connect", str(exc)
        except (ResponseCut, OSError) as exc:
            record.error, record.detail = "incomplete", repr(exc)
        except (ProtocolError, msgspec.DecodeError, ValueError) as exc:
            record.error, record.detail = "protocol", str(exc)[:500]
        if record.error is not None:
            record.e2e = None
        elif record.ttft is None:
            record.error, record.detail = "incomplete", "stream ended without content"
        planned = conv.session.turns[conv.turn].max_tokens
        conv.advance("".join(reply), record.output_tokens or planned)
        return record

    async def _stream(
        self, body: bytes, start: float, record: RequestRecord, reply: list[str]
    ) -> None:
        last: float | None = None
        chunks = 0
        usage: _Usage | None = None
        done_at: float | None = None
        async with contextlib.aclosing(
            post_sse(self.endpoint, self.path, body, self.headers)
        ) as events:
            async for data in events:
                now = self.clock.now()
                if data == b"[DONE]":
                    done_at = now  # read on to the body's end, so the connection is reused
                    continue
                chunk = _decode_chunk(data)
                if chunk.error is not None:
                    record.error, record.detail = "stream_error", str(chunk.error)[:500]
                    return
                if chunk.usage is not None:
                    usage = chunk.usage
                text = _text(chunk)
                if not text:
                    continue
                reply.append(text)
                chunks += 1
                if last is None:
                    record.ttft = now - start
                else:
                    record.gaps.append(now - last)
                last = now
        if done_at is None:
            record.error, record.detail = "incomplete", "stream ended without [DONE]"
            return
        record.e2e = done_at - start
        record.output_tokens = chunks
        if usage is not None:
            record.output_tokens = usage.completion_tokens or chunks
            record.prompt_tokens = usage.prompt_tokens
            details = usage.prompt_tokens_details
            record.cached_tokens = details.cached_tokens if details is not None else None
