"""The router: where a request goes. Pure and synchronous (no I/O), so the frontend calls
it inline on the request path and tests drive it directly.

State per worker: its cached blocks (a :class:`~dynamoctl.router.index.KvIndex` fed by
KV events, or an :class:`~dynamoctl.router.approx.ApproxIndex` learnt from decisions),
the load this router booked on it (:class:`~dynamoctl.router.load.ActiveLoad`), and the
last :class:`~dynamoctl.wire.engine.LoadMetrics` it reported. Bookings react at once and
drive the ``kv`` cost; reports drive busy detection and the load-only modes (see
:mod:`dynamoctl.router.policies` for why).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dynamoctl.kv.hash_cache import HashCache
from dynamoctl.kv.hashing import adapter_parent
from dynamoctl.kv.tiers import DEFAULT_DISK_CREDIT, DEFAULT_HOST_CREDIT, Tier, tier_of
from dynamoctl.router.approx import ApproxIndex
from dynamoctl.router.errors import AllWorkersBusy, NoWorkers
from dynamoctl.router.index import KvIndex, PrefixIndex
from dynamoctl.router.load import ActiveLoad, Booking
from dynamoctl.router.policies import (
    Candidate,
    PolicyConfig,
    RequestInfo,
    create_policy,
)
from dynamoctl.settings.routing import RouterSettings
from dynamoctl.wire.engine import LoadMetrics
from dynamoctl.wire.kv_events import KVEventBatch


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one request goes, and what the router expects there."""

    worker_id: str
    """The chosen worker's instance id."""
    overlap_blocks: int
    """Leading prompt blocks the router believes cached on it."""
    prompt_blocks: int
    """Full blocks in the prompt (``overlap_blocks / prompt_blocks``: expected hit rate)."""
    request_id: str
    """The id the load is booked under (pass it to on_first_token / on_finished)."""
    cost: float | None = None
    """The mode's cost of the chosen worker (the ``kv`` logit), if it has one."""
    tier_blocks: int = 0
    """Prompt blocks after ``overlap_blocks`` believed in its offload tiers (host, disk)."""


class KvRouter:
    """Routing state for one model's workers; see the module doc.

    ``mode`` names a policy (:func:`~dynamoctl.router.policies.mode_names`). A worker is
    *busy* when its reported KV usage exceeds ``busy_kv_usage`` (a fraction; bookings
    count too) or its waiting queue exceeds ``busy_waiting``; busy workers are skipped,
    and :class:`AllWorkersBusy` is raised when no other remains. None disables a
    threshold.
    """

    @classmethod
    def from_settings(
        cls, settings: RouterSettings, block_size: int, adapter: str | None = None
    ) -> KvRouter:
        """A router for one model, whose engines use ``block_size``, with ``settings``'
        knobs (the settings only declare them: they build nothing); ``adapter``: the model
        is that LoRA adapter, whose prompts' hash chains it seeds."""
        return cls(
            settings.mode,
            block_size,
            overlap_weight=settings.overlap_weight,
            temperature=settings.temperature,
            host_credit=settings.host_tier_credit,
            disk_credit=settings.disk_tier_credit,
            busy_kv_usage=settings.busy_kv_usage,
            busy_waiting=settings.busy_waiting,
            adapter=adapter,
        )

    def __init__(
        self,
        mode: str = "kv",
        block_size: int = 64,
        *,
        overlap_weight: float = 1.0,
        temperature: float = 0.0,
        host_credit: float = DEFAULT_HOST_CREDIT,
        disk_credit: float = DEFAULT_DISK_CREDIT,
        busy_kv_usage: float | None = None,
        busy_waiting: int | None = None,
        approx_ttl: float = 120.0,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        adapter: str | None = None,
    ) -> None:
        if overlap_weight < 0 or temperature < 0:
            raise ValueError("overlap_weight and temperature must be >= 0")
        if not (0 <= host_credit <= 1 and 0 <= disk_credit <= 1):
            raise ValueError("host_credit and disk_credit must be in [0, 1]")
        self.block_size = block_size
        """Tokens per KV block; must equal the engines' (their model cards say)."""
        # 1 means "never busy by KV usage" (RouterSettings says so): bookings of queued
        # requests can pass the whole cache, so ``> 1`` would still mark workers busy.
        self.busy_kv_usage = None if busy_kv_usage is None or busy_kv_usage >= 1 else busy_kv_usage
        """KV usage fraction above which a worker is busy; None (or 1 given): never."""
        self.busy_waiting = busy_waiting
        """Waiting requests above which a worker is busy; None: never."""
        self.policy = create_policy(
            mode,
            PolicyConfig(overlap_weight, temperature, host_credit, disk_credit),
            random.Random(seed),
        )
        self.index = KvIndex(block_size)
        """Blocks cached per worker, from KV events."""
        self.hashes = HashCache(block_size, parent=adapter_parent(adapter))
        """Prompts' block hashes, so a conversation's next turn hashes only its new blocks."""
        self.approx: ApproxIndex | None = (
            ApproxIndex(approx_ttl, clock) if self.policy.kv_source == "approx" else None
        )
        """Blocks believed cached per worker, from past decisions (``kv-approx`` only)."""
        self.load = ActiveLoad()
        """Load booked by this router."""
        self._metrics: dict[str, LoadMetrics | None] = {}  # insertion order = worker order

    @property
    def mode(self) -> str:
        return self.policy.name

    @property
    def wants_kv_events(self) -> bool:
        """Whether KV events change this router's decisions (subscribe only then)."""
        return self.policy.kv_source == "events"

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker_id: str) -> None:
        """Make ``worker_id`` routable (no-op if it is)."""
        if worker_id in self._metrics:
            return
        self._metrics[worker_id] = None
        self.index.add_worker(worker_id)
        self.load.add_worker(worker_id)
        if self.approx is not None:
            self.approx.add_worker(worker_id)

    def remove_worker(self, worker_id: str) -> None:
        """Forget ``worker_id``: its cache, its load, its bookings."""
        if self._metrics.pop(worker_id, 0) == 0:
            return
        self.index.remove_worker(worker_id)
        self.load.remove_worker(worker_id)
        if self.approx is not None:
            self.approx.remove_worker(worker_id)

    def workers(self) -> list[str]:
        return list(self._metrics)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._metrics

    # ------------------------------------------------------------------ feeds

    def apply_kv_batch(self, worker_id: str, batch: KVEventBatch) -> None:
        """Apply one batch of ``worker_id``'s KV events (ignored for unknown workers)."""
        self.index.apply_batch(worker_id, batch)

    def set_silent_tiers(self, worker_id: str, tiers: Mapping[str, int]) -> None:
        """``worker_id`` never reports evictions from these tiers (``medium`` → capacity
        in blocks): its index ages them out (docs/router.md, "Tiers"). Unknown media are
        ignored, as their events are."""
        for medium, capacity in tiers.items():
            tier = tier_of(medium)
            if tier is not None and tier is not Tier.GPU and worker_id in self._metrics:
                self.index.set_silent_tier(worker_id, tier, capacity)

    def reset_worker_kv(self, worker_id: str) -> None:
        """Forget what ``worker_id`` caches (its stream lost events, or restarted)."""
        self.index.clear_worker(worker_id)

    def update_load(self, worker_id: str, metrics: LoadMetrics) -> None:
        """The latest load ``worker_id`` reported (ignored for unknown workers)."""
        if worker_id in self._metrics:
            self._metrics[worker_id] = metrics

    def metrics(self, worker_id: str) -> LoadMetrics | None:
        return self._metrics.get(worker_id)

    # ------------------------------------------------------------------ routing

    def find_matches(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Per worker, the leading blocks of ``token_ids`` cached there (as ``pick`` sees
        them); workers with none are left out."""
        return self._overlap_index().find_matches(self.hashes.sequence_hashes(token_ids))

    def pick(
        self,
        token_ids: Sequence[int],
        request_id: str,
        *,
        exclude: Collection[str] = (),
        overlap_weight: float | None = None,
        prefilled: bool = False,
        headroom: float = 0.0,
    ) -> Decision:
        """Choose a worker for a prompt and book the request's load on it.

        ``exclude``: workers not to use (a migration retrying elsewhere).
        ``overlap_weight``: the ``kv`` cost's alpha for this request (None: the
        router's); 0 for a decode whose prompt was prefilled elsewhere, as Dynamo's
        decode router does. ``prefilled``: the prompt's KV arrives from a prefill worker,
        so no prefill tokens are booked on the chosen worker. ``headroom``: the last
        fraction of each busy threshold this request may not fill (its priority class
        keeps it for the others; docs/security.md, "Priority classes"). Raises
        :class:`NoWorkers` if none is left, :class:`AllWorkersBusy` if all are busy.
        A ``request_id`` already booked (a retry) is released first.
        """
        bs = self.block_size
        names = [w for w in self._metrics if w not in exclude] if exclude else list(self._metrics)
        if not names:
            raise NoWorkers(f"no worker available ({len(self._metrics)} known, all excluded)")
        if self.busy_kv_usage is not None or self.busy_waiting is not None:
            considered = len(names)
            # A class keeping headroom may not cross into it with its own prompt's blocks
            # (a long batch prompt admitted just under its threshold would fill the room
            # kept for the others); requests without headroom pay nothing for it.
            own = len(token_ids) // bs + 1 if headroom else 0
            names = [w for w in names if not self.is_busy(w, headroom, own)]
            if not names:
                raise AllWorkersBusy(considered)
        hashes = self.hashes.sequence_hashes(token_ids)
        index = self._overlap_index()
        if isinstance(index, ApproxIndex):
            index.expire()
        tiers = self._tier_matches(index, hashes)
        held = self.load.active_overlaps(hashes) if hashes else {}
        prefill, active = self.load.loads(names)
        trees = index.tree_sizes(names)
        n_new = len(hashes) + 1  # + the request's private block (router.load)
        metrics = self._metrics
        no_hit = (0, 0, 0)
        candidates = []
        for i, w in enumerate(names):
            gpu, host, any_tier = tiers.get(w, no_hit)
            candidates.append(
                Candidate(w, gpu, prefill[i], active[i], n_new - held.get(w, 0), trees[i],
                          metrics[w], host - gpu, any_tier - host)
            )  # fmt: skip
        request = RequestInfo(len(token_ids), len(hashes), bs, overlap_weight)
        chosen, cost = self.policy.choose(request, candidates)
        worker = chosen.worker_id
        # Booked prefill: what the worker computes, lower-tier blocks counted at their
        # credit (their transfer stands in for part of a prefill).
        overlap = self.policy.config.credited_overlap(chosen)
        uncached = 0 if prefilled else max(0, len(token_ids) - round(overlap * bs))
        self.load.book(request_id, Booking(worker, uncached, hashes))
        if self.approx is not None:
            self.approx.record(worker, hashes)
        lower = chosen.host_blocks + chosen.disk_blocks
        return Decision(worker, chosen.overlap_blocks, len(hashes), request_id, cost, lower)

    def _tier_matches(
        self, index: PrefixIndex, hashes: Sequence[int]
    ) -> dict[str, tuple[int, int, int]]:
        """Per worker: its GPU prefix hit, then the depths reached counting host memory
        and disk too (all equal when tiers are unknown or not credited)."""
        if not hashes:
            return {}
        config = self.policy.config
        if isinstance(index, KvIndex) and (config.host_credit or config.disk_credit):
            return index.find_tier_matches(hashes)
        return {w: (n, n, n) for w, n in index.find_matches(hashes).items()}

    def on_first_token(self, request_id: str) -> None:
        """The request's first token arrived: its prompt no longer waits for prefill."""
        self.load.first_token(request_id)

    def on_finished(self, request_id: str) -> None:
        """The request ended (finished, failed or cancelled): release its load.
        Idempotent; unknown ids are ignored."""
        self.load.finish(request_id)

    def is_busy(self, worker_id: str, headroom: float = 0.0, blocks: int = 0) -> bool:
        """Whether ``worker_id`` is over a busy threshold (see the class doc), each
        lowered by the fraction ``headroom``; ``blocks``: a request's own, counted on top
        of a worker's usage unless it holds nothing (an idle worker takes any request)."""
        m = self._metrics.get(worker_id)
        if m is None:
            return False  # nothing reported yet: give it the benefit of the doubt
        keep = 1.0 - headroom
        if self.busy_waiting is not None and m.num_waiting > self.busy_waiting * keep:
            return True
        if self.busy_kv_usage is not None and m.total_blocks > 0:
            usage = max(m.kv_usage, self.load.active_blocks(worker_id) / m.total_blocks)
            if usage > 0:
                usage += blocks / m.total_blocks
            return usage > self.busy_kv_usage * keep
        return False

    def _overlap_index(self) -> PrefixIndex:
        return self.approx if self.approx is not None else self.index
