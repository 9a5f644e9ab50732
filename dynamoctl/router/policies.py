"""Routing modes, registered by name: each one picks a worker among candidates.

A mode is a :class:`Policy` subclass declared with ``name=``; :func:`create_policy`
builds one by name and an unknown name fails listing the valid ones. Policies are pure:
the router hands them a view of each candidate (cache overlap, booked and reported
load) and does the booking itself.

``kv`` is Dynamo's cost (docs/router.md), with ``B`` the block size and ``alpha`` the overlap
weight::

    logit_w = alpha * PrefillTokens_w / B + DecodeBlocks_w
    PrefillTokens_w = A_w + max(0, ISL - overlap_w * B)
    DecodeBlocks_w = active_blocks_w + new blocks of this request on w
    overlap_w = gpu_w + c_host * host_w + c_disk * disk_w

where ``gpu_w`` is the GPU prefix hit and ``host_w``, ``disk_w`` the blocks after it held in
an offload tier, credited by what a hit there saves net of its transfer
(:func:`dynamoctl.kv.tiers.onboard_credit`; docs/router.md, "Tiers").

The lowest logit wins (ties: the worker with fewer cached blocks, then random), or with
temperature ``T > 0`` a worker is drawn with probability ∝ ``exp(-x_w / T)``, ``x_w`` the
logit range-normalised to [0, 1]. ``kv-approx`` is the same cost over an index learnt
from the router's own decisions instead of KV events.

The ``kv`` cost counts only the load this router booked (``A_w``, active blocks), as
docs/router.md and Dynamo define it. Reported load lags by the worker's publish interval plus
transit (a worker was seen reporting a finished request's blocks ~100 ms later), and
adding it (the larger of booked and reported) did not change the multi-turn hit rate
of tests/router/test_mocker_workers.py (0.72 vs 0.71, six runs each). The load-only
modes take the larger of the two: they have no affinity to lose, and reports also see
other routers' work.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from dynamoctl.kv.tiers import DEFAULT_DISK_CREDIT, DEFAULT_HOST_CREDIT
from dynamoctl.router.errors import UnknownMode
from dynamoctl.util.registry import Registry
from dynamoctl.wire.engine import LoadMetrics

KvSource = Literal["none", "events", "approx"]
"""Where a mode's overlaps come from: nowhere, the workers' KV events, or the router's
own past decisions."""


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """The request being routed."""

    isl: int
    """Prompt length in tokens."""
    blocks: int
    """Full blocks in the prompt."""
    block_size: int
    """Tokens per block."""
    overlap_weight: float | None = None
    """Overrides the policy's ``alpha`` for this request: 0 for a disaggregated decode,
    whose prompt is computed elsewhere (no overlap credit, docs/architecture.md)."""


@dataclass(slots=True)  # not frozen: built per worker per request, and frozen inits are slow
class Candidate:
    """One worker as a policy sees it."""

    worker_id: str
    overlap_blocks: int
    """Leading prompt blocks believed cached on the worker."""
    prefill_tokens: int
    """``A_w``: prompt tokens this router booked there, not yet prefilled."""
    active_blocks: int
    """KV blocks held by the requests this router booked there."""
    new_blocks: int
    """Blocks this request would add there: prompt blocks not already held by booked
    requests, plus its private block (:mod:`dynamoctl.router.load`)."""
    tree_size: int
    """Blocks cached on the worker (the tie-breaker: spread the cache)."""
    metrics: LoadMetrics | None = None
    """The worker's last reported load, if any."""
    host_blocks: int = 0
    """Prompt blocks after ``overlap_blocks`` believed in the worker's host-memory tier
    (contiguously; docs/router.md, "Tiers")."""
    disk_blocks: int = 0
    """Prompt blocks after those believed in its disk tier."""

    def load(self, block_size: int) -> float:
        """Load in blocks, ignoring the cache: queued prefill plus held KV, the larger of
        booked and reported (reports also see other routers' work)."""
        prefill, active = self.prefill_tokens, self.active_blocks
        if self.metrics is not None:
            prefill = max(prefill, self.metrics.prefill_tokens_queued)
            active = max(active, self.metrics.active_blocks)
        return prefill / block_size + active


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs the policies read."""

    overlap_weight: float = 1.0
    """``alpha``: weight of prefill work against decode blocks in the ``kv`` cost."""
    temperature: float = 0.0
    """0: argmin of the cost; > 0: softmax sampling over range-normalised costs."""
    host_credit: float = DEFAULT_HOST_CREDIT
    """What a host-memory block hit is worth in GPU block hits (0: tiers ignored)."""
    disk_credit: float = DEFAULT_DISK_CREDIT
    """What a disk block hit is worth in GPU block hits (0: tiers ignored)."""

    def credited_overlap(self, c: Candidate) -> float:
        """The candidate's overlap in GPU-hit equivalents (docs/router.md, "Tiers")."""
        lower = self.host_credit * c.host_blocks + self.disk_credit * c.disk_blocks
        return c.overlap_blocks + lower


class Policy:
    """Base of the routing modes; subclasses register with ``name=``."""

    name: ClassVar[str]
    """The mode's name (``--router-mode``)."""
    kv_source: ClassVar[KvSource] = "none"
    """Where the overlaps in :attr:`Candidate.overlap_blocks` come from."""

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            POLICIES.add(name, cls)

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        """The chosen candidate (``candidates`` is never empty) and its cost, if the mode
        has one."""
        raise NotImplementedError


POLICIES: Registry[type[Policy]] = Registry("router mode", UnknownMode)
"""Routing modes by name; a :class:`Policy` subclass registers itself with ``name=``."""


def mode_names() -> list[str]:
    """Registered routing modes, sorted."""
    return sorted(POLICIES)


def policy_class(name: str) -> type[Policy]:
    return POLICIES[name]


def create_policy(name: str, config: PolicyConfig, rng: random.Random) -> Policy:
    """The policy of mode ``name``; :class:`UnknownMode` lists the valid ones."""
    return policy_class(name)(config, rng)


# --------------------------------------------------------------------------- modes


class RoundRobin(Policy, name="round-robin"):
    """Each request to the next candidate in turn."""

    def __init__(self, config: PolicyConfig, rng: random.Random) -> None:
        super().__init__(config, rng)
        self._next = 0

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen, None


class Random(Policy, name="random"):
    """A uniformly random candidate."""

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        return self.rng.choice(candidates), None


class LeastLoaded(Policy, name="least-loaded"):
    """The candidate with the least load in blocks (queued prefill + held KV); ties
    random."""

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        loads = [c.load(request.block_size) for c in candidates]
        low = min(loads)
        chosen = self.rng.choice([c for c, v in zip(candidates, loads, strict=True) if v == low])
        return chosen, low


class PowerOfTwo(Policy, name="power-of-two"):
    """Two random candidates, the less loaded one wins: near least-loaded balance without
    herding every router onto the same idle worker."""

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        if len(candidates) == 1:
            return candidates[0], candidates[0].load(request.block_size)
        a, b = self.rng.sample(candidates, 2)
        la, lb = a.load(request.block_size), b.load(request.block_size)
        return (a, la) if la <= lb else (b, lb)


class KvCost(Policy, name="kv"):
    """Dynamo's KV cost over the overlaps known from KV events (module doc)."""

    kv_source: ClassVar[KvSource] = "events"

    def logit(self, request: RequestInfo, c: Candidate) -> float:
        bs = request.block_size
        overlap = self.config.credited_overlap(c)
        prefill = c.prefill_tokens + max(0.0, request.isl - overlap * bs)
        alpha = (
            self.config.overlap_weight if request.overlap_weight is None else request.overlap_weight
        )
        return alpha * prefill / bs + c.active_blocks + c.new_blocks

    def choose(
        self, request: RequestInfo, candidates: Sequence[Candidate]
    ) -> tuple[Candidate, float | None]:
        logits = [self.logit(request, c) for c in candidates]
        if self.config.temperature > 0:
            i = softmax_sample(logits, self.config.temperature, self.rng)
            return candidates[i], logits[i]
        low = min(logits)
        tied = [c for c, v in zip(candidates, logits, strict=True) if v <= low + 1e-9]
        if len(tied) > 1:
            smallest = min(c.tree_size for c in tied)
            tied = [c for c in tied if c.tree_size == smallest]
        return self.rng.choice(tied), low


class KvApprox(KvCost, name="kv-approx"):
    """The ``kv`` cost without KV events: a prompt's blocks are assumed cached on the
    worker it was routed to, for the router's ``approx_ttl``."""

    kv_source: ClassVar[KvSource] = "approx"


def softmax_sample(logits: Sequence[float], temperature: float, rng: random.Random) -> int:
    """Index drawn with probability ∝ ``exp(-x / temperature)``, ``x`` the logits scaled
    to [0, 1] (so the temperature means the same whatever the load's magnitude)."""
    low, high = min(logits), max(logits)
    if high - low <= 1e-12:
        return rng.randrange(len(logits))
    span = high - low
    weights = [math.exp(-(v - low) / span / temperature) for v in logits]
    return rng.choices(range(len(logits)), weights=weights)[0]
