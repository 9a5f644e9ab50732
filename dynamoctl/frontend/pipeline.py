"""What the endpoints built on chat completions (Anthropic's Messages, OpenAI's
Responses) use of it: a chat request's prompt and its choices, ready to run, and the
pieces every endpoint shares (:class:`dynamoctl.frontend.app._Completions` is the one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from dynamoctl.frontend.asgi import Disconnect, Message, Receive, Scope, Send
from dynamoctl.frontend.choices import Choices, Delta
from dynamoctl.frontend.generate import Generator
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ServedModel
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.frontend.refusals import Refusals
from dynamoctl.frontend.respond import count_outcomes
from dynamoctl.structured.plan import OutputPlan


class ChatPipeline(Protocol):
    generator: Generator
    metrics: FrontendMetrics
    refusals: Refusals
    max_body_bytes: int

    async def chat_prompt(
        self, body: ChatCompletionRequest
    ) -> tuple[ServedModel, OutputPlan, list[int]]: ...

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


class Answer(Protocol):
    """One request's answer in an endpoint's own shape, whole or streamed."""

    status: str | None
    """The status it ended with, when not what its choices say (an error, in-band)."""
    cancelled: bool
    """The client went away before it was written."""

    async def whole(
        self, scope: Scope, receive: Receive, send: Send, deltas: AsyncIterator[Delta]
    ) -> None: ...

    async def stream(self, receive: Receive, send: Send, deltas: AsyncIterator[Delta]) -> None: ...


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
            await answer.stream(receive, send, deltas)
        else:
            await answer.whole(scope, receive, send, deltas)
    finally:
        metrics.inflight.labels(name).dec()
        status = answer.status or ("200" if choices.done() else "error")
        count_outcomes(metrics, name, endpoint, choices.outcomes, status)
        if answer.cancelled:
            metrics.cancellations.labels(name).inc()
