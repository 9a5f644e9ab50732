"""The spans of one request (docs/operations.md, "Traces"): at the frontend a root span
for the HTTP exchange (continuing the client's ``traceparent``), ``parse``,
``tokenize``, ``route`` with each ``router.pick`` and the ``queue`` wait between them,
and ``generate`` for each worker attempt; at the worker, ``worker.generate`` (a child of
the frontend's ``generate``: its ``traceparent`` travels in the request-plane message)
with ``prefill`` (or ``kv_transfer`` when a remote prefill's KV is pulled) up to the
first token and ``decode`` after it. Spans carry explicit start and end times, so none
is "current": async generators and tasks need no context switching."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.engine import GenerateRequest

T = TypeVar("T")
_PROPAGATOR = TraceContextTextMapPropagator()


def _parent(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote parent a W3C ``traceparent`` names; None: a new trace."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def traceparent(span: Span) -> str | None:
    """``span``'s W3C ``traceparent``, for a child in another process."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


class Tracer:
    """One process's spans, exported by its provider (:mod:`.export`)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("dynamoctl")

    def request(self, name: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestTrace:
        """The root span of an HTTP request, a child of its ``traceparent`` if any."""
        parent = tracestate = None
        for key, value in headers:
            if key == b"traceparent":
                parent = value.decode("latin-1")
            elif key == b"tracestate":
                tracestate = value.decode("latin-1")
        root = self.tracer.start_span(name, _parent(parent, tracestate), SpanKind.SERVER)
        return RequestTrace(self, root)

    def serving(
        self, handler: Callable[[bytes], AsyncIterator[bytes]], role: str
    ) -> Callable[[bytes], AsyncIterator[bytes]]:
        """The worker's request-plane generate handler, its requests traced."""

        async def traced(body: bytes) -> AsyncIterator[bytes]:
            request = wire_engine.decode_request(body)
            span = self.tracer.start_span(
                "worker.generate",
                _parent(request.trace_context),
                SpanKind.SERVER,
                attributes={
                    "dynamoctl.request_id": request.request_id,
                    "dynamoctl.role": role,
                    "dynamoctl.prompt_tokens": len(request.token_ids),
                    "dynamoctl.max_tokens": request.max_tokens,
                },
            )
            pulls_kv = request.kv_transfer_params is not None and role != "prefill"
            # The engine's own spans (vLLM's) go under this one.
            ours = msgspec.structs.replace(request, trace_context=traceparent(span))
            received, first, chunks = time.time_ns(), 0, 0
            try:
                async for raw in handler(wire_engine.encode(ours)):
                    if not first:
                        first = time.time_ns()
                        self.child(span, "kv_transfer" if pulls_kv else "prefill", received, first)
                        span.add_event("first_token", timestamp=first)
                    chunks += 1
                    yield raw
            except BaseException as exc:
                _failed(span, exc)
                raise
            finally:
                end = time.time_ns()
                if first:
                    self.child(span, "decode", first, end)
                span.set_attribute("dynamoctl.chunks", chunks)
                span.end(end)

        return traced

    def child(self, parent: Span, name: str, start: int, end: int | None = None) -> Span:
        """A span under ``parent`` from ``start`` (ns since the epoch); ended at ``end``
        when given."""
        context = trace.set_span_in_context(parent)
        span = self.tracer.start_span(name, context, start_time=start)
        if end is not None:
            span.end(end)
        return span

    def shutdown(self) -> None:
        """Send what is batched and stop (blocks up to the exporter's timeout)."""
        self.provider.shutdown()


class RequestTrace:
    """One HTTP request's spans at the frontend."""

    def __init__(self, tracer: Tracer, root: Span) -> None:
        self.tracer = tracer
        self.root = root
        self.mark = time.time_ns()
        """Where the next :meth:`phase` starts."""

    def phase(self, name: str) -> None:
        """A span ``name`` from the previous phase's end (the request's start) to now."""
        now = time.time_ns()
        self.tracer.child(self.root, name, self.mark, now)
        self.mark = now

    def responded(self, status: int) -> None:
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR))

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            _failed(self.root, error)
        self.root.end()

    async def route(self, pick: Awaitable[T]) -> T:
        """``pick`` (through the admission queue) in a ``route`` span."""
        start = time.time_ns()
        span = self.tracer.child(self.root, "route", start)
        try:
            return await pick
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()
            self.mark = time.time_ns()

    def picks(self, pick: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        """``pick`` with each call a ``router.pick`` span, and the wait between a refused
        one and the next (every worker busy) a ``queue`` span."""
        refused_at: list[int] = []

        async def traced(*args: Any) -> T:
            start = time.time_ns()
            if refused_at:
                self.tracer.child(self.root, "queue", refused_at[0], start)
                refused_at.clear()
            span = self.tracer.child(self.root, "router.pick", start)
            try:
                choice = await pick(*args)
            except BaseException as exc:
                span.set_attribute("dynamoctl.refused", str(exc))
                span.end()
                refused_at.append(time.time_ns())
                raise
            span.set_attribute("dynamoctl.worker", str(getattr(choice, "name", choice)))
            span.end()
            return choice

        return traced

    def attempt(
        self, name: str, worker: str, request: GenerateRequest
    ) -> tuple[Span, GenerateRequest]:
        """A span for one request to a worker, and the request carrying its context."""
        span = self.tracer.tracer.start_span(
            name,
            trace.set_span_in_context(self.root),
            SpanKind.CLIENT,
            attributes={"dynamoctl.worker": worker, "dynamoctl.request_id": request.request_id},
        )
        return span, msgspec.structs.replace(request, trace_context=traceparent(span))

    async def ending(self, span: Span, work: Awaitable[T]) -> T:
        """``work``'s result, ``span`` ended when it is done."""
        try:
            return await work
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()

    async def streamed(self, chunks: AsyncIterator[T], span: Span) -> AsyncGenerator[T, None]:
        """``chunks`` passed through, ``span`` ended with them (first one an event)."""
        first = True
        try:
            async for raw in chunks:
                if first:
                    first = False
                    span.add_event("first_token")
                yield raw
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()


def _failed(span: Span, exc: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
