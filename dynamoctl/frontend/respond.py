"""How an answer leaves the frontend: an SSE stream (``stream``) or one JSON body
(``whole``). Both count the request once, whatever its number of choices, and turn a
client that goes away into a cancelled generation, not an error (docs/api.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from json.encoder import encode_basestring_ascii

from starlette.responses import JSONResponse

from dynamoctl.frontend.asgi import Disconnect, Message, Receive, Scope, Send
from dynamoctl.frontend.choices import Choices, Delta
from dynamoctl.frontend.errors import OpenAIError, internal_error
from dynamoctl.frontend.generate import Outcome
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.refusals import LINES
from dynamoctl.frontend.shape import Shape, sse_data, usage_of
from dynamoctl.frontend.shaping import delta_events, finish_events, shape_messages, text_frames

log = logging.getLogger(__name__)

_SSE_START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
}


async def stream(
    metrics: FrontendMetrics,
    receive: Receive,
    send: Send,
    deltas: AsyncIterator[Delta],
    shape: Shape,
    choices: Choices,
    n: int,
    include_usage: bool,
) -> None:
    """SSE: headers at once, an event per text delta, errors in-band, then ``[DONE]``.

    An event is written as soon as it is made unless the worker's next chunk is already
    buffered (``outcome.probe``, one choice) or every choice has finished: then it waits
    for the events behind it and they go out in one write, so a frontend that falls
    behind under load makes fewer, larger writes instead of one syscall per token. The
    events after the last delta (finish, usage, ``[DONE]``) go out in one write with the
    end of the body."""
    name = shape.model
    await send(_SSE_START)
    watch = Disconnect(receive)
    held: list[bytes] = []  # events not written yet: the worker's next chunk is here
    outcomes = choices.outcomes
    try:
        metrics.inflight.labels(name).inc()
        try:
            try:
                held += _openings(shape, choices, include_usage)
                await _send_deltas(send, deltas, shape, choices, include_usage, held)
                tail = held
                if include_usage:
                    final = shape.chunk(None)
                    final["choices"] = []
                    final["usage"] = usage_of(
                        outcomes, choices.prompt_tokens, choices.cached_tokens(n)
                    )
                    tail.append(sse_data(final))
            except OpenAIError as exc:  # headers are sent: report in-band, as OpenAI does
                tail = [*held, sse_data(exc.body())]
            except Exception:  # a bug: the stream still ends well-formed
                log.exception("stream of %s failed", shape.id)
                tail = [*held, sse_data(internal_error().body())]
            tail.append(b"data: [DONE]\n\n")
        except asyncio.CancelledError:  # client went away: the worker stream is cancelled
            metrics.cancellations.labels(name).inc()
            raise
        finally:
            metrics.inflight.labels(name).dec()
            status = "200" if choices.done() else "error"
            count_outcomes(metrics, name, shape.endpoint, outcomes, status)
        watch.stop()
        await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})
    except asyncio.CancelledError:
        if not watch.gone:
            raise
        watch.absorb()
    finally:
        watch.stop()


async def _send_deltas(
    send: Send,
    deltas: AsyncIterator[Delta],
    shape: Shape,
    choices: Choices,
    include_usage: bool,
    held: list[bytes],
) -> None:
    """Every delta's events, written as ``_stream`` says; what is left unwritten when
    the deltas end (or fail) stays in ``held``."""
    frames = text_frames(shape, choices, include_usage)
    shapers = choices.shapers  # reasoning and tool calls: not just text
    outcomes = choices.outcomes
    buffered = outcomes[0].probe.buffered if len(outcomes) == 1 else _never
    async for index, text in deltas:
        if not text:
            if text is None:  # the choice has finished
                held += finish_events(shape, choices, index, include_usage)
            # "": nothing to say, but the generator is about to wait: flush
        elif shapers:  # reasoning and tool calls: deltas of their own
            pushed = shapers[index].push(text)
            held += delta_events(shape, choices, index, pushed, include_usage)
        elif (frame := frames[index]) is not None:  # the per-token hot path
            held.append(frame[0] + encode_basestring_ascii(text).encode() + frame[1])
        else:
            chunk = shape.chunk(text, index=index, logprobs=choices.new_logprobs(index))
            held.append(sse_data(shape.with_usage(chunk, include_usage)))
        # Hold while more is already here (or the end is): one write for all.
        if held and not buffered() and not choices.done():
            event = held[0] if len(held) == 1 else b"".join(held)
            held.clear()
            await send({"type": "http.response.body", "body": event, "more_body": True})


def _openings(shape: Shape, choices: Choices, include_usage: bool) -> list[bytes]:
    """Events before any token: chat's role, completions' echoed prompt."""
    events = []
    for i in range(len(choices.jobs)):
        if shape.chat:
            events.append(shape.chunk("", first=True, index=i))
        elif choices.echo and choices.echo[i]:
            events.append(shape.chunk(choices.echo[i], index=i))
    return [sse_data(shape.with_usage(e, include_usage)) for e in events]


async def whole(
    metrics: FrontendMetrics,
    scope: Scope,
    receive: Receive,
    send: Send,
    deltas: AsyncIterator[Delta],
    shape: Shape,
    choices: Choices,
    n: int,
) -> None:
    """One JSON body; a client that disconnects meanwhile cancels the generation."""
    name = shape.model
    watch = Disconnect(receive)
    metrics.inflight.labels(name).inc()
    error: BaseException | None = None
    texts = list(choices.echo) if choices.echo else [""] * len(choices.jobs)
    try:
        async for index, text in deltas:
            if text:
                texts[index] += text
        if choices.echo_logprobs or choices.prompt_logprobs:
            choices.check_prompt_logprobs()
    except BaseException as exc:
        error = exc
    finally:
        watch.stop()
        metrics.inflight.labels(name).dec()
    if error is not None:
        if isinstance(error, asyncio.CancelledError) and watch.gone:
            metrics.cancellations.labels(name).inc()
            watch.absorb()
            return
        if isinstance(error, Exception):
            if not isinstance(error, OpenAIError):
                log.error("request %s failed", shape.id, exc_info=error)
            refused = error if isinstance(error, OpenAIError) else internal_error()
            count_outcomes(metrics, name, shape.endpoint, choices.outcomes, str(refused.status))
            LINES.refused(f"{shape.endpoint} request {shape.id}", refused)
            await refused.response()(scope, receive, send)
            return
        raise error
    count_outcomes(metrics, name, shape.endpoint, choices.outcomes, "200")
    parts = [
        (texts[i], outcome, choices.all_logprobs(i)) for i, outcome in enumerate(choices.outcomes)
    ]
    whole = shape.full(parts, choices.prompt_tokens, choices.cached_tokens(n))
    shape_messages(whole, choices, texts)  # reasoning, tool calls
    if choices.prompt_logprobs:
        choices.add_prompt_logprobs(whole)
    await JSONResponse(whole)(scope, receive, send)


def _never() -> bool:
    return False


def count_outcomes(
    metrics: FrontendMetrics, model: str, endpoint: str, outcomes: list[Outcome], status: str
) -> None:
    """One request, whatever its number of choices; the tokens of all of them."""
    metrics.requests.labels(model, endpoint, status).inc()
    metrics.output_tokens.labels(model).inc(sum(o.completion_tokens for o in outcomes))
    metrics.cached_tokens.labels(model).inc(sum(o.cached_tokens for o in outcomes))
