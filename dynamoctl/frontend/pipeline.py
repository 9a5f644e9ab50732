"""What the endpoints built on chat completions (Anthropic's Messages, OpenAI's
Responses) use of it: a chat request's prompt and its choices, ready to run, and the
pieces every endpoint shares (:class:`dynamoctl.frontend.app._Completions` is the one)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from dynamoctl.frontend.asgi import Disconnect, Message, Receive, Scope, Send
from dynamoctl.frontend.choices import Choices, Delta
from dynamoctl.frontend.errors import OpenAIError, internal_error
from dynamoctl.frontend.generate import Generator
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ServedModel
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.frontend.refusals import Refusals
from dynamoctl.frontend.respond import count_outcomes
from dynamoctl.structured.plan import OutputPlan

log = logging.getLogger(__name__)


class ChatPipeline(Protocol):
    generator: Generator
    metrics: FrontendMetrics
    refusals: Refusals
    max_body_bytes: int

    async def chat_prompt(
        self, body: ChatCompletionRequest
    ) -> tuple[ServedModel, OutputPlan, Sequence[int]]: ...

    async def chat_choices(
        self, body: ChatCompletionRequest, rid: str
    ) -> tuple[ServedModel, Choices]: ...


SSE_START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
}
"""The headers of an SSE answer."""


async def read_whole(
    receive: Receive, deltas: AsyncIterator[Delta], take: Callable[[str | None], object]
) -> bool:
    """Hands each of a one-choice request's texts to ``take`` (None: the choice ended)
    until the generation ends; False when the client went away meanwhile (the generation
    is cancelled). A refusal of the generation (:class:`OpenAIError`) propagates."""
    watch = Disconnect(receive)
    try:
        async for _, piece in deltas:
            take(piece)
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        watch.absorb()
        return False
    finally:
        watch.stop()
    return True


def chat_deltas(choices: Choices, piece: str | None) -> list[dict[str, Any]]:
    """A one-choice request's next text (None: its end) as chat deltas, through its
    output shaper (tool calls, reasoning) when it has one."""
    shaper = choices.shapers[0] if choices.shapers else None
    if piece is None:
        return shaper.close() if shaper else []
    if not piece:
        return []
    return shaper.push(piece) if shaper else [{"content": piece}]


class Answer(Protocol):
    """One request's answer in an endpoint's own shape: whole, or streamed as the SSE
    events its ``opening``, ``feed``, ``closing`` and ``error`` write."""

    status: str | None
    """The status it ended with, when not what its choices say (an error, in-band)."""
    cancelled: bool
    """The client went away before it was written."""

    async def whole(
        self, scope: Scope, receive: Receive, send: Send, deltas: AsyncIterator[Delta]
    ) -> None: ...

    def opening(self) -> list[bytes]:
        """The events before the first text (the stream's start)."""
        ...

    def feed(self, piece: str | None) -> list[bytes]:
        """The events a choice's next text (None: its end) makes, maybe none yet."""
        ...

    def closing(self) -> list[bytes]:
        """The events after the generation ended well (the stream's end)."""
        ...

    def error(self, exc: OpenAIError) -> list[bytes]:
        """The event an error after the headers were sent becomes (in-band)."""
        ...


async def stream_events(
    answer: Answer, choices: Choices, receive: Receive, send: Send, deltas: AsyncIterator[Delta]
) -> None:
    """Streams ``answer``'s events: what each text makes is sent at once, except once the
    generation is done (the rest goes out with the closing events, in one write). An
    error after the headers is an in-band error event; a client that leaves cancels the
    generation."""
    await send(SSE_START)
    watch = Disconnect(receive)
    events = answer.opening()
    try:
        try:
            async for _, piece in deltas:
                events += answer.feed(piece)
                if events and not choices.done():
                    body = b"".join(events)
                    events.clear()
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            events += answer.closing()
        except OpenAIError as exc:  # headers are sent: an error event
            answer.status = str(exc.status)
            events += answer.error(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stream of %s failed", choices.request_id)
            answer.status = "500"
            events += answer.error(internal_error())
        watch.stop()
        await send({"type": "http.response.body", "body": b"".join(events), "more_body": False})
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        watch.absorb()
        answer.cancelled = True
    finally:
        watch.stop()


async def serve_answer(
    chat: ChatPipeline,
    endpoint: str,
    model: ServedModel,
    choices: Choices,
    answer: Answer,
    streamed: bool,
    exchange: tuple[Scope, Receive, Send],
) -> None:
    """Runs ``choices`` into ``answer``, counted as every endpoint counts a request:
    received, input tokens, in flight, outcome by status, cancellations."""
    scope, receive, send = exchange
    metrics, name = chat.metrics, model.name
    metrics.received.labels(name).inc()
    metrics.input_tokens.labels(name).inc(choices.prompt_tokens)
    deltas = choices.run(chat.generator, model)
    metrics.inflight.labels(name).inc()
    try:
        if streamed:
            await stream_events(answer, choices, receive, send, deltas)
        else:
            await answer.whole(scope, receive, send, deltas)
    finally:
        metrics.inflight.labels(name).dec()
        status = answer.status or ("200" if choices.done() else "error")
        count_outcomes(metrics, name, endpoint, choices.outcomes, status)
        if answer.cancelled:
            metrics.cancellations.labels(name).inc()
