"""``MockerEngine``: a simulated vLLM-like engine behind the :class:`Engine` protocol.

One asyncio task runs the engine loop: schedule a step, compute its duration with the
:class:`TimingModel`, wait on the :class:`Clock` until the step's end, then apply it
(emit tokens, publish KV events). Nothing sleeps to fake work, so on a
:class:`VirtualClock` a whole workload runs as fast as Python can simulate it, with
exact timestamps, and many engines share one process (an idle one is a parked task).

While busy, each step starts where the previous one ended (not when the loop got round
to it), so a late wake-up on the real clock is caught up instead of slowing the engine.

Output tokens are ``mock_token(seed, index)``: a pure function of the request's seed (or
id) and the token's position, so they do not depend on batching or preemption; a request
ends itself after a drawn length, as a model emits end-of-sequence
(:mod:`~dynamoctl.engines.mocker.sampling`); sampling parameters are accepted and ignored.

Disaggregation (:mod:`~dynamoctl.engines.mocker.transfer`): a request whose
``kv_transfer_params`` ask ``do_remote_decode`` keeps its blocks pinned and ends with a
hand-off naming this worker; one that carries a hand-off first pulls the blocks from the
prefill worker (off the engine loop, so other requests keep stepping), then joins the
scheduler with its prompt already computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from dynamoctl.engines.api import (
    Engine,
    EngineDied,
    EngineError,
    EngineStopped,
    FinishReason,
    GenerateRequest,
    HoldsPeerWork,
    KVEventSink,
    KvTransferFailed,
    LoadMetrics,
    ModelCard,
    PeerHandler,
    PrefillsForRemoteDecode,
    ReportsKvTiers,
    ReportsStalls,
    ReportsStartup,
    RequestRejected,
    ServesAdapters,
    ServesPeers,
)
from dynamoctl.engines.mocker.adapters import MockerAdapters
from dynamoctl.engines.mocker.aic_timing import StepTiming, timing_for
from dynamoctl.engines.mocker.clock import Clock, RealClock
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.embedding import MockEmbedder, pooled
from dynamoctl.engines.mocker.gang import GangLeader
from dynamoctl.engines.mocker.images import keyed, vision_traits
from dynamoctl.engines.mocker.output import Scripts
from dynamoctl.engines.mocker.sampling import prompt_logprobs, request_seed
from dynamoctl.engines.mocker.scheduler import Scheduler
from dynamoctl.engines.mocker.sequence import StepOutput
from dynamoctl.engines.mocker.startup import Startup
from dynamoctl.engines.mocker.stream import MockerStream
from dynamoctl.engines.mocker.transfer import KvTransfers
from dynamoctl.kv.tiers import TierStats
from dynamoctl.wire.engine import EmbeddingTraits
from dynamoctl.wire.health import StartupReport
from dynamoctl.wire.kv_events import KVEventBatch
from dynamoctl.wire.kv_transfer import KV_PULL, MockerHandoff

logger = logging.getLogger(__name__)

IDLE_STEP_S = 1.0
"""Seconds between an idle gang's empty steps (its heartbeat collective)."""


@dataclass
class MockerStats:
    """Counters since the engine was made (benchmarks, debugging)."""

    steps: int = 0
    output_tokens: int = 0
    prefill_tokens: int = 0
    """Tokens computed other than decodes (prompts, recomputation after preemption)."""
    busy_s: float = 0.0
    """Simulated seconds spent in steps."""
    lag_s: float = 0.0
    """How far (simulated seconds) the clock had passed the latest step's deadline when
    the step ended; stays near 0 while the process keeps up with the clock."""


class MockerEngine(
    Engine,
    PrefillsForRemoteDecode,
    ServesPeers,
    HoldsPeerWork,
    ReportsKvTiers,
    ReportsStartup,
    ReportsStalls,
    ServesAdapters,
):
    """A simulated engine (registered as ``mocker``); see the module docstring."""

    def __init__(
        self,
        config: MockerConfig | None = None,
        *,
        clock: Clock | None = None,
        timing: StepTiming | None = None,
    ) -> None:
        self.config = config or MockerConfig()
        self.clock: Clock = clock or RealClock(self.config.speedup_ratio)
        self.timing = timing or timing_for(self.config)  # polynomial or AI Configurator
        self.startup = Startup(self.config, self.config.aic_tp_size)
        """Weights, then engine initialisation, simulated on the clock (startup.py)."""
        self.stats = MockerStats()
        self._scheduler = Scheduler(self.config)
        self._streams: dict[str, MockerStream] = {}
        self._sink: KVEventSink | None = None
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._died = asyncio.Event()
        self._gang: GangLeader | None = None
        if self.config.nnodes > 1 and not isinstance(self.clock, RealClock):
            raise ValueError("a mocker gang (nnodes > 1) runs on the real clock only")
        if self.config.node_rank != 0:
            raise ValueError("an engine is node rank 0; followers run `dynamoctl follower`")
        self.transfers = KvTransfers(self.config, self._scheduler, self.clock)
        """Pinned prefills and KV pulls (disaggregation)."""
        self._pulling: dict[str, asyncio.Task[None]] = {}
        self._to_hold = self.config.hold_first_requests
        """Requests still to hold before their first token (fault injection)."""
        self._scripts = Scripts(self.config.tokenizer)
        """Structured answers (structured outputs, tool calls, thinking)."""
        cfg = self.config
        self._card = ModelCard(
            model=cfg.model,
            tokenizer=cfg.tokenizer,
            block_size=cfg.block_size,
            kv_capacity_blocks=cfg.num_gpu_blocks,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            context_length=cfg.context_length,
            embedding=EmbeddingTraits(size=cfg.embedding_size, matryoshka=cfg.matryoshka)
            if cfg.task == "embed"
            else None,
            vision=vision_traits(cfg),
        )
        self._embedder = MockEmbedder(cfg.embedding_size, cfg.vocab_size)
        self.adapters = MockerAdapters(cfg.max_loras, cfg.lora_load_s, self.clock)

    @classmethod
    def from_options(
        cls, *, clock: Clock | None = None, timing: StepTiming | None = None, **options: Any
    ) -> MockerEngine:
        """Registry factory: ``options`` are :class:`MockerConfig` fields."""
        return cls(MockerConfig.from_options(options), clock=clock, timing=timing)

    # ------------------------------------------------------------------ Engine protocol

    @property
    def model_card(self) -> ModelCard:
        return self._card

    async def start(self) -> None:
        if self._task is not None:
            return
        cfg = self.config
        if cfg.nnodes > 1 and self._gang is None:
            gang = GangLeader(cfg.master_addr, cfg.master_port, cfg.nnodes)
            try:
                await gang.form(cfg.collective_timeout)
            except BaseException:
                gang.close()
                raise
            self._gang = gang
        if self.startup.ready_at is None:  # a restart after stop() is warm
            await self.startup.run(self.clock)
        self._failure = None
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"mocker[{self.config.model}]"
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pull in list(self._pulling.values()):
            pull.cancel()
        for rid in list(self._streams):
            self._finish_stream(rid, "abort")
        self._scheduler.clear()
        await self.transfers.close()
        gang, self._gang = self._gang, None
        if gang is not None:
            gang.close()

    async def wait_dead(self) -> EngineDied:
        """Return once the engine loop has died (a gang step past ``collective_timeout``,
        a bug); never for :meth:`stop`."""
        await self._died.wait()
        error = EngineDied(f"mocker engine loop died: {self._failure!r}")
        error.__cause__ = self._failure
        return error

    def serves_adapters(self) -> bool:
        return self.config.max_loras > 0

    async def load_adapter(self, name: str, path: str) -> None:
        await self.adapters.load(name, path)

    async def unload_adapter(self, name: str) -> None:
        self.adapters.unload(name)

    def generate(self, request: GenerateRequest) -> MockerStream:
        """Queue ``request`` now and return its output stream (errors surface when read)."""
        rid = request.request_id
        stream = MockerStream(self.abort, rid, len(request.token_ids))
        if self._task is None:
            error = EngineStopped("mocker engine is not running (start() it)")
            error.__cause__ = self._failure
            stream._fail(error)
            return stream
        params = request.kv_transfer_params or {}
        pin = bool(params.get("do_remote_decode"))
        try:
            handoff = MockerHandoff.from_params(params)
            if pin and self.transfers.address is None:
                raise RequestRejected(
                    f"request {rid!r} asks do_remote_decode, but this mocker serves no "
                    "kv_pull endpoint (run it in a prefill worker)"
                )
            if rid in self._pulling:
                raise RequestRejected(f"request id {rid!r} is already in use")
            self.adapters.check(request.adapter, rid)
            if request.images:
                request = keyed(request, self._card.vision)
            embedder = self._embedder if self._card.embedding is not None else None
            request, stream._embedding = pooled(request, embedder, self.config.matryoshka)
            script = self._scripts.script(request, request_seed(request))
            if self._to_hold > 0:  # accepted and never scheduled: see hold_first_requests
                self._to_hold -= 1
                logger.warning("request %s held before its first token (hold_first_requests)",
                               rid)  # fmt: skip
                self._streams[rid] = stream
                return stream
            if handoff is None:
                self._scheduler.add(request, pin=pin).sampler.script = script
            else:
                self._scheduler.check(request)
        except (RequestRejected, ValueError) as exc:
            stream._fail(exc if isinstance(exc, EngineError) else RequestRejected(str(exc)))
            return stream
        if request.prompt_logprobs is not None:  # computed, as a model's prefill would
            stream._prompt_logprobs = prompt_logprobs(
                request.token_ids, request.prompt_logprobs, self.config.vocab_size
            )
        self._streams[rid] = stream
        if handoff is None:
            self._work.set()
        else:
            self._pulling[rid] = asyncio.get_running_loop().create_task(
                self._pull_then_add(request, handoff), name=f"mocker-pull[{rid}]"
            )
        return stream

    async def abort(self, request_id: str) -> None:
        pull = self._pulling.pop(request_id, None)
        if pull is not None:
            pull.cancel()
        self._scheduler.abort(request_id)
        self._finish_stream(request_id, "abort")

    def set_kv_event_sink(self, sink: KVEventSink | None) -> None:
        self._sink = sink

    def load_metrics(self) -> LoadMetrics:
        load = self._scheduler.load_metrics()
        took = self.startup.took()
        return load if took is None else msgspec.structs.replace(load, startup_s=took)

    def startup_report(self) -> StartupReport:
        return self.startup.report(self.clock.now())

    def stalled_for(self) -> float:
        """Seconds the gang's current step has waited for a follower (0 without a gang)."""
        return 0.0 if self._gang is None else self._gang.stalled_for()

    # ------------------------------------------------------------------ disaggregation

    def remote_prefill_params(self) -> Mapping[str, Any]:
        return {"do_remote_decode": True}

    def peer_endpoints(self) -> Mapping[str, PeerHandler]:
        return {KV_PULL: self.transfers.serve_pull}

    def set_peer_address(self, address: str) -> None:
        self.transfers.address = address

    def pending_peer_work(self) -> int:
        return self.transfers.num_pinned

    async def _pull_then_add(self, request: GenerateRequest, handoff: MockerHandoff) -> None:
        rid = request.request_id
        try:
            await self.transfers.pull(handoff, request.token_ids, request.adapter)
            if self._task is None:
                raise EngineStopped("mocker engine stopped during a KV pull")
            seq = self._scheduler.add(request, remote_kv=True)
            seq.sampler.script = self._scripts.script(request, request_seed(request))
        except Exception as exc:  # anything, so the stream never waits on a dead pull
            if not isinstance(exc, EngineError):
                logger.exception("[mocker] KV pull for %s failed unexpectedly", rid)
                exc = KvTransferFailed(f"KV pull failed: {type(exc).__name__}: {exc}")
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream._fail(exc)
            return
        finally:
            self._pulling.pop(rid, None)
        self._work.set()

    # ------------------------------------------------------------------ mocker extras

    def cached_block_hashes(self) -> set[int]:
        """Sequence hashes in the prefix cache: what a subscriber that applied every KV
        event since start holds."""
        return self._scheduler.pool.cached_hashes()

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (publishes ``AllBlocksCleared``); False while any request
        holds blocks."""
        ok = self._scheduler.pool.reset()
        self._publish_events()
        return ok

    def kv_tier_stats(self) -> list[TierStats]:
        """Per-tier sizes and counters: GPU, then host and disk when configured."""
        sched = self._scheduler
        return sched.tiers.stats(sched.pool.num_cached)

    @property
    def num_preemptions(self) -> int:
        return self._scheduler.num_preemptions

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler and its block pool, for introspection (do not drive it)."""
        return self._scheduler

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        sched, clock, timing = self._scheduler, self.clock, self.timing
        stats = self.stats
        t = clock.now()  # simulated time the next step starts, while busy
        try:
            while True:
                if not sched.has_work():
                    self._work.clear()
                    await self._idle()
                    t = max(t, clock.now())
                # A step boundary: readers of the last step's tokens run, and requests
                # they send now join the next step, before it is planned.
                await asyncio.sleep(0)
                if not sched.has_work():
                    continue
                sched.tiers.set_time(t)
                plan = sched.schedule(t)
                if not plan.scheduled:
                    sched.finish_step(plan)  # nothing to compute: only loads in flight
                    t = await self._wait_for_loads(t)
                    continue
                dt = timing.step_ms(plan.prefill_tokens, plan.num_decode, plan.kv_usage) / 1e3
                t += dt
                if self._gang is None:
                    await clock.sleep_until(t)
                else:  # the step ends when the compute and the collective both have
                    collective = self._gang.step_within(self.config.collective_timeout)
                    await asyncio.gather(clock.sleep_until(t), collective)
                outputs = sched.finish_step(plan)
                stats.steps += 1
                stats.busy_s += dt
                stats.prefill_tokens += plan.prefill_tokens
                stats.output_tokens += len(outputs)
                stats.lag_s = clock.now() - t
                self._emit(outputs)
                self._publish_events()
        except Exception as exc:
            logger.exception("[mocker/%s] engine loop died", self.config.model)
            self._failure = exc
            self._task = None
            self._died.set()
            error = EngineStopped("mocker engine loop died")
            error.__cause__ = exc
            for stream in self._streams.values():
                stream._fail(error)
            self._streams.clear()
            self._scheduler.clear()

    async def _idle(self) -> None:
        """Wait for work. A gang keeps stepping while idle, an empty collective every
        :data:`IDLE_STEP_S`, so a frozen follower stalls a step (and shows in
        :meth:`stalled_for`) before any request is sent to it."""
        if self._gang is None:
            await self._work.wait()
            return
        while not self._work.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._work.wait(), IDLE_STEP_S)
                return
            await self._gang.step_within(self.config.collective_timeout)

    async def _wait_for_loads(self, t: float) -> float:
        """Idle until the first lower-tier load ends or a request arrives; the time the
        next step starts."""
        done = self._scheduler.next_load_done()
        if done is None:  # every added request can run alone: a bug
            raise RuntimeError("mocker scheduler made no progress with work queued")
        self._work.clear()
        waits = {
            asyncio.ensure_future(self.clock.sleep_until(done)),
            asyncio.ensure_future(self._work.wait()),
        }
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return max(t, min(done, self.clock.now()))

    def _emit(self, outputs: list[StepOutput]) -> None:
        streams = self._streams
        for seq, token, finish in outputs:
            stream = streams.get(seq.request_id)
            if stream is None:
                if finish is not None:
                    self._scheduler.unpin(seq.request_id)  # nobody to hand it to
                continue
            if seq.num_output == 1 and stream._header is not None:
                stream._header = (seq.cached_tokens, seq.prompt_len)
            if finish is not None and seq.pin:
                handoff = self.transfers.pin(seq.request_id, seq.tokens[: seq.prompt_len])
                stream._handoff = handoff.to_params()
            if stream._embedding is not None:  # an embedding: its prefill's end is its end
                stream._push(None, None if finish is None else "stop")
            else:
                sampler = seq.sampler
                logprobs = None
                if sampler.logprobs is not None:
                    logprobs = sampler.logprobs_of(token, seq.num_output - 1)
                stream._push(token, finish, logprobs)
            if finish is not None:
                del streams[seq.request_id]

    def _finish_stream(self, request_id: str, reason: FinishReason) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream._push(None, reason)

    def _publish_events(self) -> None:
        events = self._scheduler.pool.take_events()
        if events and self._sink is not None:
            self._sink(KVEventBatch(time.time(), events, self.config.data_parallel_rank))
