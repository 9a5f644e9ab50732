"""What ``dynamoctl configure`` is asked, declared once: the command's flags derive from
:class:`ConfigureOptions` (docs/architecture.md, "Options declared once"); :meth:`question`
and :meth:`target` turn it into the configurator's :class:`Question` and the recipe's
target."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from dynamoctl.configure.models import ConfigureError, DataEngine, Question
from dynamoctl.recipe.loader import RecipeError, load_recipe
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget, Target
from dynamoctl.settings.base import Options


class ConfigureOptions(Options):
    """Model, hardware, workload, targets, and what to write."""

    FLAGS: ClassVar[dict[str, str]] = {"ttft": "ttft", "tpot": "tpot"}

    model: str = ""
    """Model (required): an id AI Configurator ships, like meta-llama/Meta-Llama-3.1-70B,
    or a directory holding the model's config.json."""
    system: str = "h100_sxm"
    """GPU system as AI Configurator names it (h100_sxm, h200_sxm, b200_sxm, ...)."""
    engine: DataEngine = "vllm"
    """Engine of the recipe, and whose performance data is used."""
    engine_version: str | None = None
    """Version of the engine's performance data (default: AI Configurator's current)."""
    gpus: int | None = Field(default=None, ge=1, le=65536)
    """GPUs to use (default: all of the target's: --from-recipe, or nodes x GPUs per node)."""
    target_kind: Literal["local", "ssh", "slurm"] = "local"
    """Where the recipe runs (ignored with --from-recipe)."""
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    """GPUs on each node of an ssh or slurm target (a local target has --gpus)."""
    hosts: str = ""
    """ssh target: host names, comma-separated, the first one the head node."""
    partition: str = "gpu"
    """slurm target: the partition to submit to."""
    from_recipe: Path | None = None
    """Take target and discovery from this recipe (nodes x GPUs per node; GPUs: all)."""
    isl: int | None = Field(default=None, ge=1)
    """Mean prompt length in tokens (or --trace)."""
    osl: int | None = Field(default=None, ge=1)
    """Mean output length in tokens (or --trace)."""
    trace: Path | None = None
    """Take ISL and OSL from a Mooncake-style JSONL trace (dynamoctl bench --trace)."""
    ttft: float = Field(default=1000.0, gt=0)
    """TTFT target, ms."""
    tpot: float = Field(default=50.0, gt=0)
    """TPOT (mean inter-token latency) target, ms."""
    mode: Literal["best", "agg", "disagg"] = "best"
    """Which mode's configuration to write: the one with the most throughput per GPU, or
    the best of one mode."""
    top: int = Field(default=5, ge=1, le=50)
    """Configurations shown per mode."""
    name: str = "configured"
    """The recipe's deployment name."""
    served_name: str = ""
    """Model name clients send (default: the model id's last part, lowercased)."""
    out: Path = Path("configured.yaml")
    """Recipe file to write."""
    plot: Path | None = None
    """Pareto plot PNG (default: the recipe's path with .png)."""
    profile_out: Path | None = None
    """Also write the planner's performance profile of the chosen decode (or agg) pool
    (docs/planner.md)."""
    verify: bool = False
    """Run the chosen configuration on mocker workers with AI Configurator's timing and
    compare simulated with predicted figures."""
    verify_load: Literal["rate", "concurrency"] = "rate"
    """--verify: ``rate``: Poisson arrivals at the predicted request rate (requests spread
    out, as AI Configurator's queueing model assumes); ``concurrency``: a closed loop at
    the predicted concurrency (all sessions start together)."""
    verify_speedup: float | None = Field(default=None, gt=0, le=1000)
    """--verify: simulated seconds per real second (default: what keeps the deployment
    under 1500 streamed tokens per real second, which one CPU core of frontend carries)."""
    verify_rounds: int = Field(default=3, ge=1, le=100)
    """--verify: requests sent = rounds x the predicted concurrency."""

    @field_validator("from_recipe", "trace")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _workload(self) -> ConfigureOptions:
        if not self.model:
            raise ValueError("give --model (a shipped model id or a directory with config.json)")
        if self.trace is not None and (self.isl or self.osl):
            raise ValueError("give --trace or --isl/--osl, not both")
        if self.trace is None and not (self.isl and self.osl):
            raise ValueError("give --isl and --osl (or --trace)")
        if self.target_kind == "ssh" and not self.hosts and self.from_recipe is None:
            raise ValueError("an ssh target needs --hosts (or --from-recipe)")
        return self

    def lengths(self) -> tuple[int, int]:
        """(ISL, OSL): given, or a trace's means."""
        if self.trace is None:
            assert self.isl and self.osl
            return self.isl, self.osl
        from dynamoctl.bench.workload import read_trace

        try:
            entries = read_trace(self.trace)
        except ValueError as exc:
            raise ConfigureError(f"--trace: {exc}") from None
        isl = round(statistics.fmean(e.input_length for e in entries))
        osl = round(statistics.fmean(e.output_length for e in entries))
        return max(1, isl), max(2, osl)

    def source(self) -> tuple[Target, dict[str, Any] | None]:
        """The recipe's target (and discovery, from --from-recipe)."""
        if self.from_recipe is not None:
            try:
                recipe = load_recipe(self.from_recipe)
            except RecipeError as exc:
                raise ConfigureError(str(exc)) from None
            return recipe.target, recipe.discovery.model_dump(mode="json", exclude_none=True)
        if self.target_kind == "local":
            return LocalTarget(kind="local", gpus=self.gpus or 1), None
        per_node = self.gpus_per_node
        nodes = -(-(self.gpus or per_node) // per_node)
        if self.target_kind == "ssh":
            hosts = [h.strip() for h in self.hosts.split(",") if h.strip()]
            return SshTarget(kind="ssh", hosts=hosts, gpus_per_host=per_node), None
        return SlurmTarget(
            kind="slurm", partition=self.partition, nodes=nodes, gpus_per_node=per_node
        ), None

    def question(self, gpus: int) -> Question:
        isl, osl = self.lengths()
        return Question(
            model=self.model, system=self.system, engine=self.engine,
            engine_version=self.engine_version, gpus=gpus, isl=isl, osl=osl,
            ttft_ms=self.ttft, tpot_ms=self.tpot, top_n=self.top,
        )  # fmt: skip

    def model_name(self) -> str:
        if self.served_name:
            return self.served_name
        tail = self.model.rstrip("/").rsplit("/", 1)[-1].lower()
        return "".join(c if c.isalnum() or c in ".-" else "-" for c in tail) or "model"
