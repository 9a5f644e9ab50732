"""One request's life after validation: route, stream from a worker, detokenise, stop,
and migrate when the worker goes away.

Migration (docs/operations.md): a stream that breaks mid-generation (the worker died, or drained
past its grace and aborted us) is re-issued to another worker with the prompt plus the
tokens generated so far and the remaining ``max_tokens``; the client sees one unbroken
stream. A worker that refuses before starting (``Overloaded``: busy or draining) is simply
skipped. Either way the failed worker is excluded for the rest of the request. A worker
whose process the request plane saw die is never picked (its streams fail at once with
``PeerDeadError`` and migrate; docs/planes.md, "Dead peers").

Disaggregation (docs/architecture.md; :mod:`dynamoctl.frontend.disagg`): when the model's picker
has a prefill pool, the prompt is first prefilled remotely (or deliberately not), and the
first decode request carries the prefill's hand-off. A decode that fails before its
first token while holding a hand-off (the KV pull failed) is re-issued without it: the
decode worker then prefills locally. A migration never reuses a hand-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from dynamoctl.frontend.disagg import Handoff, Prefiller
from dynamoctl.frontend.errors import OpenAIError, overloaded
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.picking import (
    NoWorkerAvailable,
    PickFn,
    WorkerChoice,
    WorkerPicker,
    skip_unreachable,
)
from dynamoctl.frontend.tenants.fair import FairQueue, QueueTimeout
from dynamoctl.frontend.tenants.service import CURRENT
from dynamoctl.kv.images import keyed_token_ids
from dynamoctl.planes.request import (
    ClientClosedError,
    Overloaded,
    PeerDeadError,
    RemoteError,
    RequestClient,
    StreamProbe,
)
from dynamoctl.settings.frontend import AdmissionSettings
from dynamoctl.settings.keyfile import DEFAULT_CLASS
from dynamoctl.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer
from dynamoctl.tracing import TRACE
from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.engine import GenerateChunk, GenerateRequest, ImageInput, TokenLogprobs
from dynamoctl.wire.ids import TokenIds, joined
from dynamoctl.wire.records import Endpoint

log = logging.getLogger(__name__)


__all__ = ["Admission", "Generator", "Job", "NoWorkerAvailable", "Outcome", "WorkerChoice"]


@dataclass
class Admission:
    """The bounded queue in front of busy workers (docs/router.md): a request that finds every
    worker busy waits up to ``queue_timeout`` seconds for one to free up, at most ``max_queued``
    requests wait at once, and anything beyond gets 503 with ``Retry-After``. Unless
    ``fifo_admission``, the waiting requests of a model are served by their keys' classes and
    keys (:mod:`dynamoctl.frontend.tenants.fair`); with it, whoever tries first."""

    settings: AdmissionSettings = field(default_factory=AdmissionSettings)
    """How many may wait, and how long (recipe ``frontend``)."""
    poll: float = 0.02
    """Seconds between retries while waiting (load updates arrive every ~50 ms)."""
    waiting: int = 0
    on_queued: Callable[[str, int], None] | None = None
    """Told each change (+1, -1) of a class's waiting requests (``/metrics``)."""
    _queues: dict[str, FairQueue] = field(default_factory=dict)
    """Each model's fair queue."""

    def wake_all(self) -> None:
        """Wake every waiting request to check its key again (the key file changed)."""
        for queue in self._queues.values():
            queue.wake_all()

    async def pick(
        self,
        pick: PickFn,
        token_ids: Sequence[int],
        request_id: str,
        exclude: set[str],
        model: str = "",
    ) -> WorkerChoice:
        queue = self._queues.get(model) if not self.settings.fifo_admission else None
        if queue is None or not queue.waiting:  # nobody waits before it: try at once
            try:
                return await pick(token_ids, request_id, exclude)
            except NoWorkerAvailable as exc:
                if not exc.busy or self.waiting >= self.settings.max_queued:
                    raise
        elif self.waiting >= self.settings.max_queued:
            raise NoWorkerAvailable("every worker is busy and the queue is full", busy=True)
        self.waiting += 1
        try:
            deadline = time.monotonic() + self.settings.queue_timeout
            if not self.settings.fifo_admission:
                return await self._in_turn(pick, token_ids, request_id, exclude, model, deadline)
            ticket = CURRENT.get()
            while True:
                await asyncio.sleep(self.poll)
                if ticket is not None:
                    ticket.check()  # a revoked key's request leaves the queue
                try:
                    return await pick(token_ids, request_id, exclude)
                except NoWorkerAvailable as exc:
                    if not exc.busy or time.monotonic() >= deadline:
                        raise
        finally:
            self.waiting -= 1

    async def _in_turn(
        self,
        pick: PickFn,
        token_ids: Sequence[int],
        request_id: str,
        exclude: set[str],
        model: str,
        deadline: float,
    ) -> WorkerChoice:
        """Wait in the model's fair queue, in the class and key of the request's ticket."""
        ticket = CURRENT.get()
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = FairQueue(self.poll, self.on_queued)
        refused: list[NoWorkerAvailable] = []

        async def attempt() -> WorkerChoice | None:
            try:
                return await pick(token_ids, request_id, exclude)
            except NoWorkerAvailable as exc:
                if not exc.busy:
                    raise
                refused[:] = [exc]
                return None

        if ticket is None:
            who, headroom, check = (DEFAULT_CLASS, 1.0, ""), 0.0, None
        else:
            who, headroom = (ticket.class_name, ticket.weight, ticket.key_name), ticket.headroom
            check = ticket.check
        try:
            return await queue.wait(*who, attempt, deadline, headroom, check)
        except QueueTimeout:
            raise (refused or [NoWorkerAvailable("every worker stayed busy", busy=True)])[
                0
            ] from None


@dataclass
class Job:
    """One choice of a validated request, tokenised."""

    request_id: str
    model: str
    engine: GenerateRequest
    """What each attempt asks a worker for: the prompt, ``max_tokens``, end-of-sequence
    ids and sampling; an attempt replaces the id, the prompt (plus what was generated)
    and what is left of ``max_tokens`` and ``min_tokens``."""
    stop: list[str] = field(default_factory=list)
    index: int = 0
    """The choice's index in the response."""
    route_ids: list[int] | None = None
    """What the router hashes in place of the prompt when it has images: its ids with
    each image's placeholders keyed by the image (:mod:`dynamoctl.kv.images`)."""

    @property
    def prompt_ids(self) -> TokenIds:
        return self.engine.token_ids

    @property
    def max_tokens(self) -> int:
        return self.engine.max_tokens


def with_images(jobs: list[Job], images: list[ImageInput]) -> None:
    """Gives a chat prompt's jobs its images: to the engine, and to the router as keys."""
    route = keyed_token_ids(jobs[0].prompt_ids, images)
    for job in jobs:
        job.engine = msgspec.structs.replace(job.engine, images=images)
        job.route_ids = route


@dataclass
class Outcome:
    """Filled in while the stream runs; complete when it ends."""

    finish_reason: str | None = None
    completion_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    """The tokens generated so far: the token stream's own list, read by a stream that
    reports usage in every chunk (``continuous_usage_stats``) at no cost to others."""
    cached_tokens: int = 0
    migrations: int = 0
    stop_string: str | None = None
    """The stop string that ended the choice, if one did (Anthropic's ``stop_sequence``)."""
    probe: StreamProbe = field(default_factory=StreamProbe)
    """The current worker stream's buffer: while it holds chunks, more text is coming
    without waiting, so the SSE writer may hold its write and send several events at once."""
    logprobs: list[tuple[int, TokenLogprobs]] = field(default_factory=list)
    """Output tokens with their log-probabilities, when the request asked for them."""
    logprobs_sent: int = 0
    """How many of :attr:`logprobs` a stream has written."""
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    """The prompt tokens' log-probabilities, when the request asked for them."""
    embedding: list[float] | None = None
    """An embedding request's vector (:mod:`dynamoctl.frontend.embeddings`)."""

    def new_logprobs(self) -> list[tuple[int, TokenLogprobs]]:
        """The entries not written yet (streams)."""
        fresh = self.logprobs[self.logprobs_sent :]
        self.logprobs_sent = len(self.logprobs)
        return fresh


class _Migrate(Exception):
    """The worker's stream broke after it started; re-issue elsewhere."""


@dataclass
class Generator:
    """Runs jobs against workers through one request-plane client."""

    client: RequestClient
    metrics: FrontendMetrics
    max_migrations: int = 3
    """Re-issues per request before it fails with an explicit error."""
    admission: Admission = field(default_factory=Admission)
    """Queue for requests that find every worker busy."""
    prefiller: Prefiller | None = None
    """Remote prefill (disaggregation); None: always aggregated."""

    async def run(
        self, job: Job, tokenizer: Tokenizer, picker: WorkerPicker, outcome: Outcome
    ) -> AsyncIterator[str]:
        """Yield text deltas; ``outcome`` holds the finish reason and counts at the end.

        The loop: prefill remotely (or decide not to), then pick a worker, stream from it,
        and on a broken stream pick another and resume with the tokens so far."""
        ticket = CURRENT.get()
        if ticket is not None:  # the key's context limit, and its prompt counted
            ticket.start(len(job.prompt_ids), job.max_tokens)
            if ticket.priority:  # its class's priority, for engines that schedule by it
                job.engine = msgspec.structs.replace(job.engine, priority=ticket.priority)
        tokens = _TokenStream(job, tokenizer, picker, self.metrics, outcome)
        exclude: set[str] = set()
        attempt = 0
        try:
            handoff = await self._prefill(job, picker, outcome)
            while outcome.finish_reason is None:
                remote = handoff is not None
                choice = await self._pick(job, picker, remote, tokens.generated, exclude)
                request = tokens.request(attempt, handoff)
                # One decode request takes the hand-off; a re-issue after it started
                # prefills locally (the KV may be gone), a refusal keeps it.
                offered, handoff = handoff, None
                attempt += 1
                try:
                    async for text in self._attempt(choice, request, tokens, remote):
                        yield text
                except Overloaded:
                    exclude.add(choice.worker_id)  # refused before starting: nothing lost
                    picker.finished(job.request_id)  # see below
                    handoff = offered
                except (PeerDeadError, ClientClosedError, _Migrate) as exc:
                    exclude.add(choice.worker_id)
                    # Its booking on the worker it leaves goes now, not at the re-pick: a
                    # re-pick may wait in the admission queue, and bookings held there by
                    # migrating requests made that worker busy for everyone else.
                    picker.finished(job.request_id)
                    self._migrating(job, choice, exc, outcome, len(tokens.generated))
                except RemoteError as exc:
                    self._handoff_failed(job, exc, remote and not tokens.generated)
        finally:
            picker.finished(job.request_id)
            outcome.completion_tokens = len(tokens.generated)
            if ticket is not None:
                ticket.finish(outcome.completion_tokens)
            if outcome.finish_reason is not None:
                self.metrics.duration.labels(job.model).observe(tokens.elapsed())

    async def _prefill(self, job: Job, picker: WorkerPicker, outcome: Outcome) -> Handoff | None:
        """The remote prefill's hand-off, or None: prefill on the decode worker."""
        if self.prefiller is None or not self.prefiller.applies(picker):
            return None
        prompt = msgspec.structs.replace(job.engine, request_id=job.request_id)
        if (trace := TRACE.get()) is None:
            handoff = await self.prefiller.prefill(prompt, job.model, picker)
        else:  # the prefill worker's spans join the trace under this one
            span, prompt = trace.attempt("prefill.remote", "", prompt)
            handoff = await trace.ending(span, self.prefiller.prefill(prompt, job.model, picker))
        if handoff is not None:
            outcome.cached_tokens = handoff.cached_tokens
        return handoff

    async def _pick(
        self, job: Job, picker: WorkerPicker, remote: bool, generated: list[int], exclude: set[str]
    ) -> WorkerChoice:
        """A worker for the next attempt, through the admission queue, never one whose
        process the request plane saw die; none is a 503."""
        chosen: PickFn = picker.pick_decode if remote else picker.pick
        pick = skip_unreachable(chosen, self.client)
        trace = TRACE.get()
        if trace is not None:
            pick = trace.picks(pick)
        try:
            admitted = self.admission.pick(
                pick,
                joined(job.route_ids or job.prompt_ids, generated),
                job.request_id,
                exclude,
                job.model,
            )
            return await (admitted if trace is None else trace.route(admitted))
        except NoWorkerAvailable as exc:
            if generated:
                raise OpenAIError(
                    503, f"stream lost its worker and none can resume it: {exc}",
                    type="service_unavailable",
                ) from exc  # fmt: skip
            self.metrics.rejections.labels(job.model).inc()
            raise overloaded(str(exc)) from exc

    async def _attempt(
        self, choice: WorkerChoice, request: GenerateRequest, tokens: _TokenStream, remote: bool
    ) -> AsyncIterator[str]:
        """Stream one request from one worker; an aborted stream raises :class:`_Migrate`."""
        outcome = tokens.outcome
        if (trace := TRACE.get()) is not None:
            span, request = trace.attempt("generate", choice.name, request)
        body = wire_engine.encode(request)
        runs = self.client.stream_runs(choice.address, Endpoint.GENERATE, body, probe=outcome.probe)
        if trace is not None:
            runs = trace.streamed(runs, span)
        async with contextlib.aclosing(runs):
            async for run in runs:
                for chunk in tokens.joined(run):
                    if chunk.cached_tokens is not None and not (remote or tokens.generated):
                        # The attempt that computes the prompt: not a re-issue with tokens
                        # already generated, nor a remote prefill's decode.
                        outcome.cached_tokens = chunk.cached_tokens
                    if chunk.finish_reason == "abort":
                        yield ""  # writers flush what they hold before the re-pick
                        raise _Migrate("worker aborted the stream")
                    text = tokens.push(chunk)
                    if text or not outcome.probe.buffered():
                        yield text  # "" too when about to wait: writers may flush
                    if outcome.finish_reason is not None:
                        return  # aclosing cancels the worker's stream on a stop string

    def _migrating(
        self, job: Job, choice: WorkerChoice, exc: Exception, outcome: Outcome, tokens: int
    ) -> None:
        """Count a migration, or fail the request past :attr:`max_migrations`."""
        if outcome.migrations >= self.max_migrations:
            raise OpenAIError(
                503, f"request failed after {outcome.migrations} migrations: {exc}",
                type="service_unavailable",
            ) from exc  # fmt: skip
        outcome.migrations += 1
        self.metrics.migrations.labels(job.model).inc()
        log.warning(
            "request %s: worker %s failed (%s); migrating with %d tokens",
            job.request_id, choice.name, exc, tokens,
        )  # fmt: skip

    def _handoff_failed(self, job: Job, exc: RemoteError, before_first_token: bool) -> None:
        """A worker's error: the decode worker could not take the prefill's KV (the pull
        failed) before its first token, so it (or another) prefills locally; any other
        is the request's 500."""
        if not before_first_token:
            raise OpenAIError(500, f"worker error: {exc}", type="internal_error") from exc
        self.metrics.prefill_fallbacks.labels(job.model, "handoff_failed").inc()
        log.warning("request %s: KV hand-off failed (%s); prefilling locally",
                    job.request_id, exc)  # fmt: skip


class _TokenStream:
    """A request's tokens as they arrive from one worker after another: what was
    generated, its text (detokenised, stop strings applied), TTFT and inter-token
    latency."""

    def __init__(
        self,
        job: Job,
        tokenizer: Tokenizer,
        picker: WorkerPicker,
        metrics: FrontendMetrics,
        outcome: Outcome,
    ) -> None:
        self.job, self.picker, self.outcome = job, picker, outcome
        self.started = time.monotonic()
        self.last_token_at: float | None = None
        self.generated = outcome.generated
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringMatcher(job.stop)
        self.joins = not any(job.stop)
        """Whether chunks that arrive together may be joined (:meth:`joined`)."""
        self.user_stops = frozenset(job.engine.user_stop_token_ids)
        self.ttft = metrics.ttft.labels(job.model)
        self.itl = metrics.itl.labels(job.model)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def request(self, attempt: int, handoff: Handoff | None) -> GenerateRequest:
        """The next attempt: the prompt plus what was generated, for what is left."""
        job, done = self.job, len(self.generated)
        return msgspec.structs.replace(
            job.engine,
            request_id=f"{job.request_id}-{attempt}",
            token_ids=joined(job.prompt_ids, self.generated),
            max_tokens=job.max_tokens - done,
            min_tokens=max(0, job.engine.min_tokens - done),
            kv_transfer_params=handoff.params if handoff is not None else None,
        )

    def joined(self, run: list[bytes]) -> list[GenerateChunk]:
        """A run of raw chunks that arrived together, decoded; plain token chunks (no
        log-probabilities, embedding or hand-off) joined into one, so that a stream that
        fell behind is detokenised and written once per run, not once per token
        (docs/api.md, "Streaming"). A request with stop strings keeps its chunks apart:
        tokens past a stop string must not count as generated."""
        chunks = [wire_engine.decode_chunk(raw) for raw in run]
        if len(chunks) == 1 or not self.joins or not all(map(_plain, chunks)):
            return chunks
        last = chunks[-1]
        if last.finish_reason == "abort":  # its tokens are dropped, as when alone
            return [_joined(chunks[:-1]), last] if len(chunks) > 2 else chunks
        return [_joined(chunks)]

    def push(self, chunk: GenerateChunk) -> str:
        """The text ``chunk`` adds; sets the outcome's finish reason when it ends."""
        now = time.monotonic()
        if chunk.token_ids:
            if self.last_token_at is None:
                self.ttft.observe(now - self.started)
                self.picker.first_token(self.job.request_id)
            else:
                self.itl.observe((now - self.last_token_at) / len(chunk.token_ids))
            self.last_token_at = now
            self.generated += chunk.token_ids
            if chunk.logprobs is not None:
                self.outcome.logprobs += zip(chunk.token_ids, chunk.logprobs, strict=False)
        if chunk.embedding is not None:
            self.outcome.embedding = chunk.embedding
        if chunk.prompt_logprobs is not None:  # a retried attempt's come again: keep one
            self.outcome.prompt_logprobs += chunk.prompt_logprobs
            del self.outcome.prompt_logprobs[len(self.job.prompt_ids) :]
        shown = chunk.token_ids
        if chunk.finish_reason == "stop" and shown and shown[-1] in self.user_stops:
            shown = shown[:-1]  # a client's stop token ends the text, as a stop string does
        text, stopped = self.stops.push(self.detok.push(shown))
        if stopped:
            self.outcome.finish_reason = "stop"
            self.outcome.stop_string = self.stops.matched
        elif chunk.finish_reason is not None:
            text += self.stops.flush(self.detok.flush())
            # A stop string can complete in the held-back tail.
            self.outcome.finish_reason = "stop" if self.stops.stopped else chunk.finish_reason
            self.outcome.stop_string = self.stops.matched
        return text


def _plain(chunk: GenerateChunk) -> bool:
    """Nothing but tokens, a finish reason and the first chunk's counts."""
    return (
        chunk.logprobs is None
        and chunk.prompt_logprobs is None
        and chunk.embedding is None
        and chunk.kv_transfer_params is None
    )


def _joined(chunks: list[GenerateChunk]) -> GenerateChunk:
    """Plain chunks as one: their tokens in order, the last's finish reason, the first's
    counts."""
    first = chunks[0]
    tokens = [t for chunk in chunks for t in chunk.token_ids]
    return GenerateChunk(
        tokens,
        chunks[-1].finish_reason,
        cached_tokens=first.cached_tokens,
        prompt_tokens=first.prompt_tokens,
    )
