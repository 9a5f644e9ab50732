"""What the planner decides over and what it decides: metrics snapshots in, typed decisions
out, and the small state the loops carry from one decision to the next.

Times are seconds on the planner's own monotonic clock (the component stamps each
snapshot when it reads it); latencies are seconds."""

from __future__ import annotations

from typing import Literal

import msgspec

from dynamoctl.settings.component import Role

Action = Literal["up", "down", "hold"]
Loop = Literal["throughput", "load"]


class TrafficSample(msgspec.Struct, frozen=True, kw_only=True):
    """One throughput interval as the frontend saw it."""

    at: float
    """When the interval ended."""
    interval: float
    """Its length, seconds (> 0)."""
    requests: int
    """Requests that arrived in it."""
    mean_isl: float = 0.0
    """Their mean prompt length, tokens (meaningless when ``requests`` is 0)."""
    mean_osl: float = 0.0
    """Their mean output length, tokens."""
    ttft: float | None = None
    """Mean observed time to first token; ``None`` when nothing finished a prefill."""
    itl: float | None = None
    """Mean observed inter-token latency."""
    decode_batch: float | None = None
    """Mean requests running per decode (or aggregated) replica, for the ITL correction."""


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    """What the next throughput interval is expected to bring."""

    rate: float
    """Requests per second."""
    isl: float
    """Mean prompt (input) length, tokens."""
    osl: float
    """Mean output length, tokens."""
    trend: float = 0.0
    """Recent slope of the rate, requests/s per second (the forecast looks a start-up
    ahead along it, :func:`~dynamoctl.planner.ahead.rate_ahead`)."""


class PoolMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """A pool's live load, from its workers' load streams and the frontend's latencies."""

    at: float
    """When these were read."""
    ready: int
    """Replicas ready and serving."""
    queued_prefill_tokens: int = 0
    """Prompt tokens accepted but not yet prefilled, summed over the ready replicas."""
    kv_usage: float = 0.0
    """KV cache usage, mean over the ready replicas (0..1)."""
    ttft: float | None = None
    """Recent mean time to first token of requests prefilled by this pool."""
    itl: float | None = None
    """Recent mean inter-token latency of requests decoded by this pool."""
    inflight: int = 0
    """Requests waiting or running on the ready replicas (the backlog a step is sized to)."""
    frontend_queued: dict[str, int] = {}
    """Requests waiting in the frontends' admission queues for a busy worker, by priority
    class (docs/security.md, "Priority classes"): demand the workers do not see yet."""
    arrival_rate: float | None = None
    """Requests per second the frontends received in the window; None: unknown."""
    mean_isl: float = 0.0
    """Mean prompt length of those requests, tokens."""
    mean_osl: float = 0.0
    """Mean output length of the requests that ended in the window, tokens."""
    startup_s: float | None = None
    """Longest start-up (seconds from start to ready) its replicas reported; None: none
    reports one."""
    spares: int = 0
    """Warm spares of the pool on standby (recipe ``spares``): a scale-up of at most this
    many replicas is that many promotions, not starts."""
    promotion_s: float | None = None
    """Seconds a promotion of one of its spares takes (the longest measured, else the
    supervisor's promotion bound); None without spares."""

    def lead_s(self, startup_s: float | None, replicas: int = 1) -> float | None:
        """Seconds until ``replicas`` more are ready: a promotion when the spares cover
        them, else ``startup_s`` (a cold start)."""
        if self.promotion_s is not None and 0 < replicas <= self.spares:
            return self.promotion_s
        return startup_s


class PoolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A pool the planner scales: what the recipe and the planner settings say of it."""

    role: Role
    gpus_per_replica: int
    """GPUs each replica holds (0 for the mocker; it still counts as 1 against the budget)."""
    min_replicas: int
    max_replicas: int

    @property
    def budget_units(self) -> int:
        """What one replica costs against the GPU budget."""
        return max(self.gpus_per_replica, 1)


class PoolState(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner remembers of a pool between decisions."""

    target: int
    """Replicas last asked of the supervisor (the deployment's count at start)."""
    floor: int = 0
    """The throughput loop's floor: the load loop never goes under it."""
    changed_at: float | None = None
    """When ``target`` last changed (the cool-down runs from there)."""
    up_streak: int = 0
    """Load intervals in a row that called for one more replica."""
    down_streak: int = 0
    """Load intervals in a row that allowed one fewer."""
    startup_s: float | None = None
    """The pool's start-up time, the longest its replicas reported (kept once seen)."""
    needs: tuple[int, ...] = ()
    """Replicas the arrival rate and backlog needed at each of the latest load intervals,
    a start-up's worth of them: a scale-down goes to their highest, never lower."""


class PlannerState(msgspec.Struct, frozen=True, kw_only=True):
    """Every scaled pool's :class:`PoolState`."""

    pools: dict[Role, PoolState]

    @classmethod
    def start(cls, replicas: dict[Role, int]) -> PlannerState:
        """The state of a deployment running ``replicas`` per pool, never scaled yet."""
        return cls(pools={role: PoolState(target=count) for role, count in replicas.items()})


class PoolDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one loop decided for one pool, and why."""

    role: Role
    current: int
    """Replicas asked for before this decision."""
    desired: int
    """Replicas to ask for now (equal to ``current`` when holding)."""
    floor: int
    """The throughput loop's floor after this decision."""
    action: Action
    budget_bound: bool = False
    """The targets need more than the GPU budget leaves this pool."""
    needed: int | None = None
    """Replicas the targets need (throughput loop), before bounds and budget."""
    reason: str
    """One line for people: the signal, its value and the threshold it crossed."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One loop's decision over every scaled pool, with the inputs it came from."""

    loop: Loop
    at: float
    pools: tuple[PoolDecision, ...]
    gpus: int
    """Budget units the desired replicas hold together (never above ``budget``)."""
    budget: int
    forecast: Forecast | None = None
    """The throughput loop's forecast (``None``: none yet, or the load loop)."""
    observed: TrafficSample | None = None
    """The throughput interval the corrections came from."""
    lead_s: float | None = None
    """How far ahead the throughput loop carried its forecast: one start-up, as measured
    or the settings' guess (:func:`dynamoctl.planner.ahead.lead_time`)."""
    load: dict[Role, PoolMetrics] | None = None
    """The load loop's snapshot."""

    @property
    def budget_bound(self) -> bool:
        """Some pool needs more than the budget leaves it."""
        return any(pool.budget_bound for pool in self.pools)

    @property
    def changes(self) -> dict[Role, int]:
        """Pools whose replica count changes, with the new count (what to ask to scale)."""
        return {pool.role: pool.desired for pool in self.pools if pool.desired != pool.current}

    @property
    def reason(self) -> str:
        """Every pool's reason on one line."""
        return "; ".join(f"{pool.role}: {pool.reason}" for pool in self.pools)
