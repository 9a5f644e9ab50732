"""The planner's knobs, declared once (docs/architecture.md, "Options declared once"): the
recipe's ``planner:`` section and the flags of ``dynamoctl planner`` both come from
:class:`PlannerSettings`; :class:`PlannerOptions` adds what every component is told and
the pools it scales. What each knob does to a decision: docs/planner.md."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from dynamoctl.settings.base import Options
from dynamoctl.settings.component import ComponentSettings, Role

PlannerMode = Literal["both", "throughput", "load"]
PLANNER_MODES: tuple[str, ...] = get_args(PlannerMode)
"""Which loops run: both (the throughput loop sets a floor, the load loop moves above it),
or one of them alone."""

POOL_ROLES: tuple[Role, ...] = ("prefill", "decode", "agg")
"""Every pool the planner may scale (a deployment has agg, or prefill and decode)."""

PredictorKind = Literal["constant", "moving-average", "kalman"]
PREDICTOR_KINDS: tuple[str, ...] = get_args(PredictorKind)
"""The predictors' names (their registry, ``dynamoctl.planner.predict.PREDICTORS``, is
tested equal)."""


class PlannerSettings(Options):
    """Latency targets, the pools' bounds and GPU budget, and how the two loops behave."""

    mode: PlannerMode = "both"
    """Loops that run: ``both`` (forecast sets each pool's floor, live load moves it up or
    down by one above it), ``throughput`` (forecast only) or ``load`` (live load only)."""
    ttft_target_ms: float = Field(default=500.0, ge=1.0, le=600_000.0)
    """Time-to-first-token target in milliseconds (the prefill pool is sized for it)."""
    itl_target_ms: float = Field(default=50.0, ge=0.1, le=60_000.0)
    """Inter-token latency target in milliseconds (the decode pool is sized for it)."""

    prefill_min_replicas: int = Field(default=1, ge=0, le=1024)
    """Fewest prefill replicas the planner keeps (0: remote prefill may stop entirely)."""
    prefill_max_replicas: int = Field(default=8, ge=0, le=1024)
    """Most prefill replicas the planner asks for."""
    decode_min_replicas: int = Field(default=1, ge=1, le=1024)
    """Fewest decode replicas the planner keeps (every request ends on one)."""
    decode_max_replicas: int = Field(default=8, ge=1, le=1024)
    """Most decode replicas the planner asks for."""
    agg_min_replicas: int = Field(default=1, ge=1, le=1024)
    """Fewest aggregated replicas the planner keeps."""
    agg_max_replicas: int = Field(default=8, ge=1, le=1024)
    """Most aggregated replicas the planner asks for."""
    gpu_budget: int = Field(default=8, ge=1, le=65_536)
    """Most GPUs the scaled pools may hold together; a replica without GPUs (the mocker)
    counts as one. Never exceeded: when the targets need more, the pools are scaled to the
    budget and the decision says ``budget-bound``."""

    throughput_interval: float = Field(default=180.0, ge=1.0, le=86_400.0)
    """Seconds between throughput-loop decisions (forecast, then replicas from the profile)."""
    load_interval: float = Field(default=5.0, ge=0.1, le=3_600.0)
    """Seconds between load-loop decisions (±1 replica per pool from live metrics)."""
    cooldown: float = Field(default=30.0, ge=0.0, le=86_400.0)
    """Seconds after a pool was scaled during which the load loop leaves it alone (a new
    replica needs time to start and take load; a drained one to hand its work back)."""
    stable_intervals: int = Field(default=2, ge=1, le=100)
    """Load intervals in a row that must all call for the same move before the load loop
    makes it, so one noisy sample never scales a pool."""
    scale_down_fraction: float = Field(default=0.8, gt=0.0, lt=1.0)
    """A pool scales down only while its latency is under this fraction of the target (the
    band between it and the target is where the planner holds)."""
    kv_usage_up: float = Field(default=0.9, gt=0.0, le=1.0)
    """KV cache usage (fraction, mean over a pool's replicas) at which a decode or
    aggregated pool scales up."""
    kv_usage_down: float = Field(default=0.5, ge=0.0, lt=1.0)
    """KV cache usage under which a decode or aggregated pool may scale down."""
    prefill_queue_up: float = Field(default=1.0, gt=0.0, le=100.0)
    """Queued prefill work per replica, in TTFT targets, at which a pool that prefills
    scales up (1: the queue alone would take the whole TTFT target to clear)."""
    prefill_queue_down: float = Field(default=0.1, ge=0.0, le=100.0)
    """Queued prefill work per replica, in TTFT targets, under which a pool that prefills
    may scale down."""
    scale_down_hold: float = Field(default=1.0, ge=0.0, le=100.0)
    """Start-up times every signal must stay low before a pool loses a replica (at least
    ``stable_intervals``): a dip shorter than that is held through, since a replica
    removed and asked back costs one start-up of missed targets. With the frontends'
    arrival rate known, the pool goes down only to the highest need of that many
    start-ups' worth of intervals (at least the ``cooldown``'s), in one step."""
    forecast_startups: float = Field(default=1.0, ge=0.0, le=100.0)
    """How many start-up times ahead the throughput loop forecasts (along the rate's
    trend), so replicas it asks for are ready when the load comes; never less than one
    ``throughput_interval``."""
    stale_after: float = Field(default=15.0, ge=0.1, le=86_400.0)
    """Seconds after which a pool's metrics are stale: the planner then holds the pool (it
    never scales down on missing data)."""

    predictor: PredictorKind = "kalman"
    """Load predictor of the throughput loop: ``constant`` (the last interval again),
    ``moving-average`` or ``kalman`` (local linear trend, noise fitted to the series)."""
    predictor_window: int = Field(default=32, ge=2, le=4096)
    """Intervals of history the predictor keeps (the moving average's width, the Kalman
    fit's series)."""
    profile: str | None = None
    """Performance profile file (JSON, written by a profiling sweep) the throughput loop
    sizes pools from. Unset: the throughput loop cannot run and only the load loop acts."""

    @model_validator(mode="after")
    def _coherent(self) -> PlannerSettings:
        for role in POOL_ROLES:
            low, high = self.bounds(role)
            if low > high:
                raise ValueError(
                    f"{role}_min_replicas ({low}) is more than {role}_max_replicas ({high})"
                )
        if self.kv_usage_down >= self.kv_usage_up:
            raise ValueError("kv_usage_down must be under kv_usage_up (the band is the hold)")
        if self.prefill_queue_down >= self.prefill_queue_up:
            raise ValueError("prefill_queue_down must be under prefill_queue_up")
        return self

    def bounds(self, role: Role) -> tuple[int, int]:
        """(fewest, most) replicas of the pool in ``role``."""
        low: int = getattr(self, f"{role}_min_replicas")
        high: int = getattr(self, f"{role}_max_replicas")
        return low, high

    @property
    def ttft_target(self) -> float:
        """The TTFT target in seconds (the unit of every computation)."""
        return self.ttft_target_ms / 1000.0

    @property
    def itl_target(self) -> float:
        """The ITL target in seconds."""
        return self.itl_target_ms / 1000.0


class PlannerPools(Options):
    """The pools a deployment has and what their replicas hold (rendered by the plan from
    the recipe's ``workers``): the planner scales these and no others."""

    agg_gpus: int | None = Field(default=None, ge=0, le=4096)
    """GPUs per replica of the aggregated pool; unset: the deployment has none."""
    prefill_gpus: int | None = Field(default=None, ge=0, le=4096)
    """GPUs per replica of the prefill pool; unset: the deployment has none."""
    decode_gpus: int | None = Field(default=None, ge=0, le=4096)
    """GPUs per replica of the decode pool; unset: the deployment has none."""
    engine: str = "mocker"
    """The pools' engine (a profile measured on another is refused)."""
    model: str = ""
    """The served model (a profile measured for another is refused; empty: not checked)."""

    def gpus(self) -> dict[Role, int]:
        """GPUs per replica of each pool the deployment has, in :data:`POOL_ROLES` order."""
        values: dict[Role, int | None] = {
            role: getattr(self, f"{role}_gpus") for role in POOL_ROLES
        }
        return {role: gpus for role, gpus in values.items() if gpus is not None}


class PlannerOptions(ComponentSettings):
    """Everything ``dynamoctl planner`` is told on its command line."""

    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    """Targets, bounds, budget and the loops' behaviour."""
    pools: PlannerPools = Field(default_factory=PlannerPools)
    """The pools it scales."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of ``/metrics`` and ``/health``; 0 picks a free one (registered)."""
    drain_grace: float = Field(default=0.0, ge=0.0)
    """Seconds between leaving discovery and exiting (a planner has no work in flight)."""
