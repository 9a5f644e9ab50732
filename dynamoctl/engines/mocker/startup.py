"""The mocker's start-up: reading the weights, then engine initialisation (docs/mocker.md,
"Start-up").

A real replica is not ready when its process starts: vLLM reads the weights (bytes at the
bandwidth of where they come from) and then compiles and captures CUDA graphs. The mocker
simulates both as a state machine on its own :class:`~.clock.Clock`: :meth:`Startup.run`
walks the phases, each ending at a deadline on that clock (so it runs ``speedup`` times
faster than the wall on a :class:`~.clock.RealClock`, and instantly on a virtual one),
while :meth:`Startup.report` says at any moment which phase it is in and how many bytes
are loaded. The worker reports that in ``/health`` and ``/metrics``; once ready, the
engine's load stream carries the seconds it took, which the planner reads as the pool's
start-up time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import msgspec

from dynamoctl.engines.mocker.clock import Clock
from dynamoctl.wire.health import StartupPhase, StartupReport

WeightSource = Literal["shared-fs", "local-disk", "page-cache"]

SOURCE_GBPS: dict[WeightSource, float] = {
    "shared-fs": 1.0,
    "local-disk": 3.0,
    "page-cache": 10.0,
}
"""Read bandwidth (GB/s, 1e9 bytes/s) of each weight source per replica; where the numbers
come from: docs/mocker.md, "Start-up"."""

DEFAULT_ENGINE_INIT_S = 30.0
"""Engine initialisation (compile, CUDA graph capture, KV allocation) when weights are
simulated and ``engine_init_s`` is unset (docs/mocker.md, "Start-up")."""

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


class StartupOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a mocker starts (recipe ``engine_args``; inherited by ``MockerConfig``). Nothing
    set: ready at once, as before start-up was modelled."""

    weights_model: str | None = None
    """Model whose weights are read at start: an id AI Configurator ships or a directory
    with its ``config.json`` (bytes = parameters x dtype size, over ``aic_tp_size``)."""
    weights_bytes: int | None = None
    """Bytes each replica reads at start (overrides ``weights_model``)."""
    weights_source: WeightSource = "shared-fs"
    """Where the weights are read from: ``shared-fs``, ``local-disk`` or ``page-cache``."""
    weights_gbps: float | None = None
    """Read bandwidth in GB/s (overrides ``weights_source``'s default)."""
    engine_init_s: float | None = None
    """Seconds of engine initialisation after the weights (compile, CUDA graphs); unset:
    30 when weights are read, else 0."""


def parameter_count(facts: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its configuration (AI Configurator's
    ``model_facts``): embeddings (and an untied head), attention (Q, K, V, O) and MLP
    (dense gated, or every expert of an MoE plus its router) per layer."""
    hidden, layers, vocab = facts["hidden_size"], facts["layers"], facts["vocab"]
    heads, kv_heads, head = facts["n"], facts["n_kv"], facts["d"]
    raw = facts.get("raw_config") or {}
    embeddings = vocab * hidden * (1 if raw.get("tie_word_embeddings") else 2)
    attention = hidden * heads * head * 2 + hidden * kv_heads * head * 2
    experts = facts.get("num_experts") or 0
    if experts:
        mlp = experts * 3 * hidden * facts["moe_inter_size"] + hidden * experts
    else:
        mlp = 3 * hidden * facts["inter_size"]
    return int(embeddings + layers * (attention + mlp + 2 * hidden))


def weight_bytes(model: str, tp_size: int = 1) -> int:
    """Bytes one of ``tp_size`` ranks reads of ``model``'s weights: a directory's
    ``*.safetensors`` files as they are (a real or generated checkpoint, on the shared
    path or in the node's model cache), else from AI Configurator's model configuration
    (needs ``dynamoctl[configure]``)."""
    shards = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    if shards:
        return math.ceil(sum(p.stat().st_size for p in shards) / max(tp_size, 1))
    from dynamoctl.configure import aic

    facts = aic.model_facts(aic.resolve_model(model))
    dtype = str((facts.get("raw_config") or {}).get("torch_dtype", "bfloat16"))
    return math.ceil(parameter_count(facts) * _DTYPE_BYTES.get(dtype, 2) / max(tp_size, 1))


class Startup:
    """The start-up state machine of one engine (see the module docstring)."""

    def __init__(self, options: StartupOptions, tp_size: int = 1) -> None:
        size, model = options.weights_bytes, options.weights_model
        if size is None:
            size = weight_bytes(model, tp_size) if model is not None else 0
        self.bytes: int = size
        if self.bytes < 0:
            raise ValueError(f"weights_bytes must be >= 0, got {self.bytes}")
        self.gbps = options.weights_gbps or SOURCE_GBPS[options.weights_source]
        if not self.gbps > 0:
            raise ValueError(f"weights_gbps must be > 0, got {self.gbps}")
        init = options.engine_init_s
        self.init_s = (DEFAULT_ENGINE_INIT_S if self.bytes else 0.0) if init is None else init
        if self.init_s < 0:
            raise ValueError(f"engine_init_s must be >= 0, got {self.init_s}")
        self.weights_s = self.bytes / (self.gbps * 1e9)
        self.began: float | None = None
        self.ready_at: float | None = None

    @property
    def expected_s(self) -> float:
        """Simulated seconds from start to ready."""
        return self.weights_s + self.init_s

    async def run(self, clock: Clock) -> None:
        """Go through the phases on ``clock``; returns when the engine is ready."""
        self.began = clock.now()
        await clock.sleep_until(self.began + self.weights_s)
        await clock.sleep_until(self.began + self.expected_s)
        self.ready_at = clock.now()

    def report(self, now: float) -> StartupReport:
        """The phase at simulated time ``now`` and the bytes read by then."""
        began = now if self.began is None else self.began
        elapsed = (self.ready_at if self.ready_at is not None else now) - began
        if self.ready_at is not None:
            phase: StartupPhase = "ready"
        else:
            phase = "weights" if elapsed < self.weights_s else "init"
        loaded = self.bytes if self.weights_s == 0 else min(1.0, elapsed / self.weights_s)
        return StartupReport(
            phase=phase,
            elapsed_s=round(elapsed, 3),
            expected_s=round(self.expected_s, 3),
            weights_bytes=self.bytes,
            loaded_bytes=int(loaded * self.bytes) if self.weights_s else self.bytes,
        )

    def took(self) -> float | None:
        """Simulated seconds the start-up took, once ready."""
        if self.ready_at is None or self.began is None:
            return None
        return self.ready_at - self.began
