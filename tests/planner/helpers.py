"""A small profile whose numbers can be checked by hand, and builders for the loops' inputs."""

from __future__ import annotations

from typing import cast

from dynamoctl.planner.perf import DecodePoint, PerfModel, PrefillPoint, Profile
from dynamoctl.planner.records import PlannerState, PoolMetrics, PoolSpec
from dynamoctl.settings.component import Role

# Prefill: 0.1 s for 1000 tokens, 0.25 s for 2000. Decode: ITL grows 1 ms per request at
# context 1000 (10 ms alone), 2 ms per request at context 3000 (20 ms alone).
PROFILE = Profile(
    version=1,
    model="tiny",
    engine="mocker",
    gpus_per_replica=1,
    prefill=(PrefillPoint(isl=2000, seconds=0.25), PrefillPoint(isl=1000, seconds=0.1)),
    decode=(
        DecodePoint(batch=1, context=1000, itl=0.010),
        DecodePoint(batch=11, context=1000, itl=0.020),
        DecodePoint(batch=1, context=3000, itl=0.020),
        DecodePoint(batch=11, context=3000, itl=0.040),
    ),
    source="hand-made",
)


def model() -> PerfModel:
    """The performance model of :data:`PROFILE`."""
    return PerfModel(PROFILE)


def spec(role: Role, low: int = 1, high: int = 8, gpus: int = 1) -> PoolSpec:
    """A pool of ``gpus``-GPU replicas bounded to ``[low, high]``."""
    return PoolSpec(role=role, gpus_per_replica=gpus, min_replicas=low, max_replicas=high)


def state(**targets: int) -> PlannerState:
    """A deployment running ``targets`` replicas per pool, never scaled."""
    return PlannerState.start(cast("dict[Role, int]", targets))


def metrics(
    at: float,
    ready: int,
    *,
    kv: float = 0.0,
    queued: int = 0,
    ttft: float | None = None,
    itl: float | None = None,
) -> PoolMetrics:
    """A pool's live metrics read at ``at``."""
    return PoolMetrics(
        at=at, ready=ready, kv_usage=kv, queued_prefill_tokens=queued, ttft=ttft, itl=itl
    )
