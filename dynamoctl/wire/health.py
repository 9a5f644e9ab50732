"""What a worker process's ``/health`` answers: the contract the supervisor's probes read
(typed here, so that neither side parses the other's Prometheus text by metric name)."""

from __future__ import annotations

from typing import Literal

import msgspec

HealthStatus = Literal["starting", "ready", "draining"]


class WorkerHealth(msgspec.Struct, kw_only=True):
    """``GET /health`` of a worker process, as JSON; 200 when ``ready``, else 503."""

    status: HealthStatus
    instances: list[str] = []
    """Instance ids of the process (``--num-workers``)."""
    inflight: int = 0
    """Request-plane streams open, over all its instances."""
    kv_usage: float = 0.0
    """Mean fraction of its instances' KV blocks held by requests."""
    output_tokens: int = 0
    """Tokens generated since it started, over all its instances: a hung engine's stops
    moving while requests are in flight."""
    stalled_s: float = 0.0
    """Seconds the longest-waiting collective of its engines has waited on another member
    of its gang (a frozen follower); 0 when none waits or the engine has no gang."""
