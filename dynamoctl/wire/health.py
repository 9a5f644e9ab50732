"""What a worker process's ``/health`` answers: the contract the supervisor's probes read
(typed here, so that neither side parses the other's Prometheus text by metric name)."""

from __future__ import annotations

from typing import Literal

import msgspec

from dynamoctl.wire.model_cache import StagingReport

HealthStatus = Literal["starting", "ready", "standby", "draining"]
"""``standby``: a warm spare, engine ready, kept out of routing until promoted (503)."""
StartupPhase = Literal["weights", "init", "ready"]


class StartupReport(msgspec.Struct, frozen=True, kw_only=True):
    """Where an engine's start-up stands (engines that simulate it: the mocker)."""

    phase: StartupPhase
    """Reading the weights, initialising (compile, graphs), or ready."""
    elapsed_s: float
    """Engine seconds since start-up began (the whole start-up once ready)."""
    expected_s: float
    """Engine seconds the whole start-up takes."""
    weights_bytes: int
    """Bytes of weights this replica reads."""
    loaded_bytes: int
    """Of those, bytes read so far."""


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
    startup: StartupReport | None = None
    """Its first instance's engine start-up, when the engine reports one (the mocker)."""
    staging: StagingReport | None = None
    """What staging the weights into the node's model cache did before the engine
    started (``model.cache``); None without a cache. Set while staging too (the process
    answers ``starting`` then)."""
    stalled_s: float = 0.0
    """Seconds the longest-waiting collective of its engines has waited on another member
    of its gang (a frozen follower); 0 when none waits or the engine has no gang."""
    adapters: list[str] = []
    """LoRA adapters its instances hold (``dynamoctl lora``), by served name."""
