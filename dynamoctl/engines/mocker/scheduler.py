"""A vLLM-v1-style scheduler over the :class:`BlockPool`, one step at a time.

Each step (:meth:`Scheduler.schedule`, then :meth:`Scheduler.finish_step` once the step's
time has passed):

1. Running requests first, in order: each gets the tokens it still has to compute (one
   when decoding, a prompt chunk when prefilling), within the step's token budget
   ``max_num_batched_tokens``. When the pool cannot supply a block, the most recently
   admitted running request is preempted: its blocks are released (they stay cached),
   its progress is dropped, and it goes back to the *front* of the waiting queue. It
   keeps the tokens it has emitted: on readmission it recomputes prompt + output (mostly
   prefix-cache hits) and continues with its next token, so nothing is lost or repeated.
2. Then, unless something was preempted, waiting requests in order while the budget,
   ``max_num_seqs`` and free blocks allow: the longest cached prefix is reused (at most
   ``len - 1`` tokens: the last one is always computed, as vLLM does) and the rest is
   computed, chunked over several steps when it exceeds the budget. A request whose
   prefix continues in a lower KV tier (host, disk) is admitted **loading** instead: it
   takes GPU blocks for the blocks to load and leaves the step's budget alone; the load
   queues on the engine's one host-to-GPU link (``blocks x block_bytes / tier bandwidth``)
   and the request joins the running queue at the first step that starts after it ends.
   Other requests compute meanwhile: only the loading request waits for its load, as in
   vLLM's offloading connector (docs/mocker.md, "KV tiers").

A request samples its next token when a step computes its last known token. Blocks are
registered in the prefix cache once all their tokens are computed. A request that could
not complete even alone in the engine is refused when added, so the loop never stalls.

Disaggregation (docs/architecture.md): a request added with ``pin=True`` (a prefill for a remote
decode) keeps its blocks held when it finishes; :meth:`Scheduler.take_pinned` hands them
to the caller, which releases them once a decode worker pulled them (or they expired). A
request added with ``remote_kv=True`` (its prompt's KV was pulled from a prefill worker)
is admitted with the whole prompt but its last token already computed: that token is run
as a decode step (a one-token forward over the pulled KV, as vLLM recomputes it), so the
decode worker spends no prefill compute. After a preemption it recomputes like any
request: the pulled KV is gone.
"""

from __future__ import annotations

from array import array
from collections import Counter, deque

from dynamoctl.engines.api import FinishReason, GenerateRequest, LoadMetrics, RequestRejected
from dynamoctl.engines.mocker import priority
from dynamoctl.engines.mocker.block_pool import BlockPool
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.sampling import MockSampler
from dynamoctl.engines.mocker.sequence import SeqState, Status, StepOutput, StepPlan
from dynamoctl.engines.mocker.tiers import KvTiers
from dynamoctl.kv import hashing
from dynamoctl.kv.hash_cache import HashCache


class Scheduler:
    """Waiting and running queues over a :class:`BlockPool` (see the module docstring)."""

    def __init__(self, config: MockerConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size)
        self.tiers = KvTiers(config, self.pool.add_event)
        """Host and disk tiers under the pool (inert without ``num_host_blocks``)."""
        self.pool.listener = self.tiers.on_pool_event
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self.loading: list[SeqState] = []
        """Admitted, waiting for their lower-tier blocks (``ready_at``), in load order."""
        self._link_free_at = 0.0  # when the host-to-GPU link finishes its queued loads
        self._seqs: dict[str, SeqState] = {}
        self._stepping = False
        self._aborted_in_step: list[SeqState] = []
        self._caching = config.enable_prefix_caching
        # Per adapter (each starts its chains elsewhere): an agent's next turn extends its
        # last prompt, whose ~2000 block hashes (a 32k-token history) are then reused.
        self._hash_caches: dict[str | None, HashCache] = {}
        self.num_preemptions = 0
        """Preemptions since start (a counter for metrics)."""
        self._pinned: dict[str, SeqState] = {}  # finished pinned requests, not taken yet
        self._by_priority = config.scheduling_policy == "priority"
        self._arrivals = 0

    # ------------------------------------------------------------------ requests

    def _hashes_of(self, request: GenerateRequest, ids: array[int]) -> list[int]:
        cache = self._hash_caches.get(request.adapter)
        if cache is None:
            parent = hashing.adapter_parent(request.adapter)
            cache = self._hash_caches[request.adapter] = HashCache(
                self.config.block_size, parent=parent
            )
        return cache.sequence_hashes(ids)

    def add(
        self, request: GenerateRequest, *, pin: bool = False, remote_kv: bool = False
    ) -> SeqState:
        """Queue ``request``; :class:`RequestRejected` if it could never complete.
        ``pin``, ``remote_kv``: see the module docstring."""
        ids = self.check(request)
        hashes = self._hashes_of(request, ids) if self._caching else []
        cfg = self.config
        sampler = MockSampler(request, cfg.vocab_size, cfg.eos_distribution, cfg.eos_mean_tokens)
        seq = SeqState(request, hashes, pin, remote_kv, sampler)
        self._seqs[seq.request_id] = seq
        self._arrivals += 1
        seq.arrival = self._arrivals
        if self._by_priority:
            priority.queue_in_order(self.waiting, seq)
        else:
            self.waiting.append(seq)
        return seq

    def check(self, request: GenerateRequest) -> array[int]:
        """:class:`RequestRejected` if ``request`` could never complete here; else its
        prompt as u32s (the hashes' input: packing checks the ids' range in C, where a
        ``min``/``max`` pass cost ~1.3 ms on a 32k-token prompt)."""
        cfg, rid = self.config, request.request_id
        prompt, max_tokens = len(request.token_ids), request.max_tokens
        if rid in self._seqs:
            raise RequestRejected(f"request id {rid!r} is already in use")
        if prompt == 0:
            raise RequestRejected(f"request {rid!r} has an empty prompt")
        if max_tokens < 1:
            raise RequestRejected(f"request {rid!r}: max_tokens must be >= 1, got {max_tokens}")
        try:
            ids = hashing.le_u32(request.token_ids)
        except OverflowError:
            raise RequestRejected(f"request {rid!r}: token ids must be in [0, 2**32)") from None
        if prompt + max_tokens > cfg.context_length:
            raise RequestRejected(
                f"request {rid!r}: prompt ({prompt}) + max_tokens ({max_tokens}) exceeds the "
                f"context length {cfg.context_length} (max_model_len)"
            )
        # The last output token is never computed into KV; everything before it may be.
        kv_tokens = prompt + max_tokens - 1
        blocks = -(-kv_tokens // cfg.block_size)
        if blocks > cfg.num_gpu_blocks:
            raise RequestRejected(
                f"request {rid!r} needs {blocks} KV blocks (prompt {prompt} + max_tokens "
                f"{max_tokens}) but the engine has {cfg.num_gpu_blocks} (num_gpu_blocks)"
            )
        if not cfg.enable_chunked_prefill and kv_tokens > cfg.max_num_batched_tokens:
            raise RequestRejected(
                f"request {rid!r}: prompt ({prompt}) + max_tokens ({max_tokens}) may need "
                f"{kv_tokens} tokens computed in one step but max_num_batched_tokens is "
                f"{cfg.max_num_batched_tokens} (or set enable_chunked_prefill)"
            )
        return ids

    def abort(self, request_id: str) -> bool:
        """Remove a request and free its blocks; False if unknown or already finished."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.LOADING:  # no step uses its blocks yet
            self.loading.remove(seq)
            self.pool.release(seq.blocks)
            seq.blocks = []
        elif self._stepping:  # blocks are in use by the step: free them when it ends
            self._aborted_in_step.append(seq)
        else:
            self.running.remove(seq)
            self.pool.release(seq.blocks)
            seq.blocks = []
        seq.status = Status.FINISHED
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def next_load_done(self) -> float | None:
        """When the earliest lower-tier load ends (None: nothing loading)."""
        return min((s.ready_at for s in self.loading), default=None)

    def clear(self) -> None:
        """Drop every request and release its blocks (engine stop); the cache stays."""
        for seq in [*self.running, *self.loading, *self._pinned.values()]:
            self.pool.release(seq.blocks)
            seq.blocks = []
        self._pinned.clear()
        for seq in self._seqs.values():
            seq.status = Status.FINISHED
        self.running = []
        self.loading = []
        self.waiting.clear()
        self._seqs.clear()
        self._aborted_in_step.clear()
        self._stepping = False

    # ------------------------------------------------------------------ one step

    def schedule(self, now: float = 0.0) -> StepPlan:
        """Pick the work of the step that starts at simulated time ``now`` and allocate
        its blocks (see the module docstring)."""
        plan = StepPlan()
        self._stepping = True
        self._start_loaded(now)
        budget = self._continue_running(plan, self.config.max_num_batched_tokens)
        if not plan.num_preempted:
            self._admit_waiting(plan, budget, now)
        plan.kv_usage = self.pool.num_active / self.config.num_gpu_blocks
        return plan

    def _start_loaded(self, now: float) -> None:
        """Loading requests whose blocks are in GPU memory by ``now`` start running."""
        # Loads end in admission order (one link, first come first served).
        if not self.loading or self.loading[0].ready_at > now:
            return
        still = []
        for seq in self.loading:
            if seq.ready_at > now:
                still.append(seq)
                continue
            self._store_full_blocks(seq)  # loaded: now in the GPU prefix cache
            seq.status = Status.RUNNING
            self.running.append(seq)
        self.loading = still

    def _continue_running(self, plan: StepPlan, budget: int) -> int:
        """Schedule the running sequences in order, preempting from the back when blocks
        run out; the token budget left."""
        pool, bs, running = self.pool, self.config.block_size, self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_tokens = len(seq.tokens)
            todo = num_tokens - seq.num_computed
            n = todo if todo < budget else budget
            end = seq.num_computed + n
            if end > len(seq.blocks) * bs:  # crosses into blocks it does not hold yet
                need = -(-end // bs) - len(seq.blocks)
                while need > pool.num_free:
                    victim = (
                        priority.take_victim(running, i) if self._by_priority else running.pop()
                    )
                    self._preempt(victim)
                    plan.num_preempted += 1
                    if victim is seq:
                        break
                if seq.status is not Status.RUNNING:
                    break
                seq.blocks += pool.allocate(need)
            plan.scheduled.append((seq, n))
            budget -= n
            if todo == 1 and num_tokens > seq.prompt_len:
                plan.num_decode += 1
            else:
                plan.prefill_tokens += n
            i += 1
        return budget

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        """Admit waiting sequences, in order, while budget, sequence slots and blocks last."""
        cfg, pool, tiers = self.config, self.pool, self.tiers
        bs, running = cfg.block_size, self.running
        while self.waiting and budget > 0 and len(running) + len(self.loading) < cfg.max_num_seqs:
            seq = self.waiting[0]
            hits = (
                pool.match_prefix(seq.hashes, (len(seq.tokens) - 1) // bs) if self._caching else []
            )
            remote = seq.remote_kv and seq.cached_tokens < 0  # pulled KV, first admission
            # Lower-tier blocks right after the GPU hit are onboarded (docs/mocker.md).
            lower = self._tier_hits(seq, len(hits)) if tiers.enabled and not remote else []
            computed = (len(hits) + len(lower)) * bs
            if lower and self._caching:
                if len(lower) + pool.num_unheld(hits) > pool.num_free:
                    break
                self._admit_loading(seq, hits, lower, now)
                plan.num_loading += 1
                continue
            if remote:
                computed = len(seq.tokens) - 1
            n = len(seq.tokens) - computed
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            need = -(-(computed + n) // bs) - len(hits)
            if need + pool.num_unheld(hits) > pool.num_free:
                break
            pool.acquire(hits)  # before allocating, so that allocation cannot evict them
            if self._caching:
                self._onboard(seq, hits, [])
            seq.blocks = hits + pool.allocate(need)
            seq.num_computed = computed
            seq.num_stored = len(hits)
            if seq.cached_tokens < 0:
                seq.cached_tokens = computed
            seq.status = Status.RUNNING
            self.waiting.popleft()
            running.append(seq)
            plan.scheduled.append((seq, n))
            if remote:
                plan.num_decode += 1  # the last prompt token over pulled KV: a decode
            else:
                plan.prefill_tokens += n
            budget -= n

    def _admit_loading(self, seq: SeqState, hits: list[int], lower: list[int], now: float) -> None:
        """Admit ``seq`` to load ``lower`` after its GPU ``hits``: blocks for them now, its
        compute once the link has carried them (``ready_at``)."""
        pool = self.pool
        load_s = self._onboard(seq, hits, lower)
        pool.acquire(hits)  # before allocating, so that allocation cannot evict them
        seq.blocks = hits + pool.allocate(len(lower))
        seq.num_computed = len(seq.blocks) * self.config.block_size
        seq.num_stored = len(hits)
        if seq.cached_tokens < 0:
            seq.cached_tokens = seq.num_computed
        # One host-to-GPU link per engine: loads queue on it, first admitted first served.
        self._link_free_at = seq.ready_at = max(now, self._link_free_at) + load_s
        seq.status = Status.LOADING
        self.waiting.popleft()
        self.loading.append(seq)

    def finish_step(self, plan: StepPlan) -> list[StepOutput]:
        """The step's compute is done: record progress, sample tokens, finish requests."""
        cfg, pool = self.config, self.pool
        bs = cfg.block_size
        outputs: list[StepOutput] = []
        finished = False
        caching, running = self._caching, Status.RUNNING
        for seq, n in plan.scheduled:
            if seq.status is not running:
                continue  # aborted during the step
            seq.num_computed += n
            if caching and seq.num_computed // bs > seq.num_stored:
                self._store_full_blocks(seq)
            tokens = seq.tokens
            if seq.num_computed < len(tokens):
                continue  # a prompt chunk: no token yet
            num_output = len(tokens) - seq.prompt_len
            token, stop = seq.sampler.token(num_output)
            tokens.append(token)
            num_output += 1
            if caching and len(tokens) % bs == 0:
                parent = seq.hashes[-1] if seq.hashes else hashing.adapter_parent(seq.adapter)
                seq.hashes += hashing.sequence_hashes(tokens[-bs:], bs, parent)
            finish: FinishReason | None = None
            if stop:
                finish = "stop"
            elif num_output >= seq.max_tokens:
                finish = "length"
            outputs.append(StepOutput(seq, token, finish))
            if finish is not None:
                if seq.pin:
                    self._pinned[seq.request_id] = seq  # blocks stay held: take_pinned
                else:
                    pool.release(seq.blocks)
                    seq.blocks = []
                seq.status = Status.FINISHED
                del self._seqs[seq.request_id]
                finished = True
        for seq in self._aborted_in_step:
            pool.release(seq.blocks)
            seq.blocks = []
            finished = True
        self._aborted_in_step.clear()
        if finished:
            self.running = [s for s in self.running if s.status is Status.RUNNING]
        self._stepping = False
        return outputs

    def pinned(self, request_id: str) -> SeqState | None:
        """A finished pinned request, its blocks still held (see :meth:`unpin`)."""
        return self._pinned.get(request_id)

    def unpin(self, request_id: str) -> bool:
        """Release a finished pinned request's blocks (pulled, or expired); False if it
        has none. Safe during a step: no step uses a finished request's blocks."""
        seq = self._pinned.pop(request_id, None)
        if seq is None:
            return False
        self.pool.release(seq.blocks)
        seq.blocks = []
        return True

    def _tier_hits(self, seq: SeqState, gpu_hits: int) -> list[int]:
        limit = (len(seq.tokens) - 1) // self.config.block_size
        return seq.hashes[gpu_hits : gpu_hits + self.tiers.match(seq.hashes[gpu_hits:limit])]

    def _onboard(self, seq: SeqState, hits: list[int], lower: list[int]) -> float:
        """Account an admission's lookup in the tiers; seconds its onboarding takes."""
        tiers = self.tiers
        if seq.cached_tokens < 0:  # first admission: what the hit rates count
            tiers.record_lookup(len(seq.hashes), len(hits))
        tiers.note_hits(seq.hashes[: len(hits)])
        tiers.note_hits(lower)
        return tiers.onboard(lower)

    def _store_full_blocks(self, seq: SeqState) -> None:
        bs = self.config.block_size
        full = seq.num_computed // bs
        start = seq.num_stored
        if full > start:
            self.pool.store(
                seq.blocks[start:full],
                seq.hashes[start:full],
                seq.hashes[start - 1] if start else None,
                seq.tokens[start * bs : full * bs],
                seq.adapter,
            )
            seq.num_stored = full

    def _preempt(self, seq: SeqState) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_stored = 0
        seq.status = Status.WAITING
        if self._by_priority:
            priority.queue_in_order(self.waiting, seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def check_invariants(self) -> None:
        """Assert the scheduler's and pool's bookkeeping agree; call between steps (tests)."""
        bs, pool = self.config.block_size, self.pool
        holds: Counter[int] = Counter()
        for seq in self.running:
            assert seq.status is Status.RUNNING, seq.request_id
            assert len(seq.blocks) == -(-seq.num_computed // bs), f"{seq.request_id}: blocks"
            assert seq.num_stored <= seq.num_computed // bs, f"{seq.request_id}: stored"
            for block, h in zip(seq.blocks[: seq.num_stored], seq.hashes, strict=False):
                # None: it filled while an identical block was cached, so it stayed out.
                assert pool.block_hash(block) in (h, None), f"{seq.request_id}: block hash"
            holds.update(seq.blocks)
        for seq in self.waiting:
            assert seq.status is Status.WAITING and not seq.blocks, seq.request_id
        for seq in self.loading:
            assert seq.status is Status.LOADING, seq.request_id
            assert len(seq.blocks) * bs == seq.num_computed, f"{seq.request_id}: loading"
            holds.update(seq.blocks)
        for seq in self._pinned.values():
            assert seq.status is Status.FINISHED, seq.request_id
            holds.update(seq.blocks)
        assert len(self._seqs) == len(self.running) + len(self.waiting) + len(self.loading), (
            "request table"
        )
        pool.check(holds)

    # ------------------------------------------------------------------ metrics

    def load_metrics(self) -> LoadMetrics:
        """Current load. ``prefill_tokens_queued`` counts waiting prompts in full: their
        prefix hits are known only once they are scheduled."""
        queued = sum(len(s.tokens) - s.num_computed for s in (*self.waiting, *self.loading))
        for s in self.running:
            todo = len(s.tokens) - s.num_computed
            if todo > 1 or not s.num_output:
                queued += todo
        pool = self.pool
        return LoadMetrics(
            active_blocks=pool.num_active,
            total_blocks=pool.num_blocks,
            num_waiting=len(self.waiting),
            num_running=len(self.running) + len(self.loading),
            prefill_tokens_queued=queued,
            kv_usage=pool.num_active / pool.num_blocks,
        )
