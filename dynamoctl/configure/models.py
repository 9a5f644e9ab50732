"""What ``dynamoctl configure`` asks and answers, in our own types (docs/configure.md).

AI Configurator answers in pandas DataFrames whose columns change between releases;
:mod:`dynamoctl.configure.aic` turns them into these structs, and everything else
(the table, the recipe, the plot, ``--verify``, the planner profile) reads only these.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

Mode = Literal["agg", "disagg"]
"""Aggregated (each replica prefills and decodes) or disaggregated (prefill and decode
pools, KV moved between them)."""

DataEngine = Literal["vllm", "sglang", "trtllm"]
"""Engines AI Configurator has data for; each is also the recipe's engine name."""
ENGINES: tuple[str, ...] = get_args(DataEngine)


class ConfigureError(ValueError):
    """Input the configurator cannot answer; the message says what to change."""


class ConfigureUnavailable(ConfigureError):
    """The ``configure`` extra is not installed."""


class Question(msgspec.Struct, frozen=True, kw_only=True):
    """One configuration question: a model on some GPUs under a workload and its targets."""

    model: str
    """A model id AI Configurator ships a config for, or a directory with config.json."""
    system: str
    """GPU system as AI Configurator names it (``h100_sxm``, ``h200_sxm``, ...)."""
    engine: str
    """``vllm``, ``sglang`` or ``trtllm``."""
    engine_version: str | None = None
    """Version of the engine's performance data; None: the newest."""
    gpus: int
    """GPUs the deployment may use, over all nodes."""
    isl: int
    """Mean prompt length, tokens."""
    osl: int
    """Mean output length, tokens."""
    ttft_ms: float
    """Time-to-first-token target."""
    tpot_ms: float
    """Time-per-output-token target (mean inter-token latency)."""
    top_n: int = 5
    """Configurations kept per mode."""


class Parallel(msgspec.Struct, frozen=True, kw_only=True):
    """How one engine instance splits the model over its GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    """Attention data parallelism inside one instance (MoE models)."""
    moe_tp: int = 1
    moe_ep: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of one instance: attention TP x DP x PP (MoE TP x EP shares them)."""
        return self.tp * self.dp * self.pp

    def label(self) -> str:
        parts = [f"TP{self.tp}"]
        parts += [
            f"{name}{value}" for name, value in (("PP", self.pp), ("DP", self.dp)) if value > 1
        ]
        if self.moe_ep > 1:
            parts.append(f"EP{self.moe_ep}")
        return " ".join(parts)


class Pool(msgspec.Struct, frozen=True, kw_only=True):
    """One pool of identical engine instances in a configuration."""

    parallel: Parallel
    batch_size: int
    """Requests one instance runs at once (``max-num-seqs``)."""
    workers: int
    """Instances of this pool in one unit of the configuration (a disaggregated unit
    pairs some prefill with some decode workers); 1 for agg."""


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    """What AI Configurator predicts for one configuration at its concurrency."""

    ttft_ms: float
    tpot_ms: float
    tokens_per_s_gpu: float
    """Output tokens per second per GPU of the unit."""
    tokens_per_s_user: float
    """Output tokens per second each request sees (1000 / TPOT)."""
    request_rate: float
    """Requests per second one unit completes."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One configuration: ``units`` copies of a unit of ``gpus_per_unit`` GPUs."""

    mode: Mode
    rank: int
    """1 is AI Configurator's best of this mode under the targets."""
    agg: Pool | None = None
    prefill: Pool | None = None
    decode: Pool | None = None
    gpus_per_unit: int
    units: int
    """Copies of the unit the GPUs hold (AI Configurator's replicas)."""
    concurrency: int
    """Requests in flight per unit at the predicted point."""
    predicted: Prediction

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_unit * self.units

    def pools(self) -> dict[str, Pool]:
        """The configuration's pools by recipe role."""
        named = {"agg": self.agg, "prefill": self.prefill, "decode": self.decode}
        return {role: pool for role, pool in named.items() if pool is not None}

    def label(self) -> str:
        if self.agg is not None:
            return f"agg {self.agg.parallel.label()} x{self.units}"
        assert self.prefill is not None and self.decode is not None
        return (
            f"disagg {self.prefill.workers}P({self.prefill.parallel.label()}) + "
            f"{self.decode.workers}D({self.decode.parallel.label()}) x{self.units}"
        )


class FrontPoint(msgspec.Struct, frozen=True):
    """A point of a Pareto front: throughput per GPU against throughput per user."""

    tokens_per_s_user: float
    tokens_per_s_gpu: float


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """AI Configurator's answer to a :class:`Question`."""

    question: Question
    engine_version: str
    """The performance data's version actually used."""
    candidates: tuple[Candidate, ...]
    """Best first within each mode, agg before disagg."""
    fronts: dict[str, tuple[FrontPoint, ...]]
    """The Pareto front of each mode searched."""
    chosen: Mode
    """The mode whose best configuration gives the most throughput per GPU."""

    def best(self, mode: Mode) -> Candidate | None:
        return next((c for c in self.candidates if c.mode == mode), None)

    def verdict(self) -> str:
        """One line: which mode wins and by how much."""
        agg, disagg = self.best("agg"), self.best("disagg")
        if agg is None or disagg is None:
            only = agg or disagg
            return f"only {only.mode if only else 'no'} configurations meet the targets"
        win, lose = (agg, disagg) if self.chosen == "agg" else (disagg, agg)
        ratio = win.predicted.tokens_per_s_gpu / max(lose.predicted.tokens_per_s_gpu, 1e-9)
        return (
            f"{win.mode} wins: {win.predicted.tokens_per_s_gpu:.1f} tok/s/GPU, "
            f"{ratio:.2f}x {lose.mode}'s {lose.predicted.tokens_per_s_gpu:.1f}"
        )
