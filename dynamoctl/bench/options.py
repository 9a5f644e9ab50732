"""What ``dynamoctl bench`` is asked to do, declared once: the command's flags, their help,
bounds and defaults derive from :class:`BenchOptions` (docs/architecture.md, "Options
declared once"); :meth:`BenchOptions.config` turns it into the runner's
:class:`~dynamoctl.bench.runner.BenchConfig`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from dynamoctl.bench.runner import BenchConfig
from dynamoctl.bench.schedule import Limits
from dynamoctl.bench.stats import Slo
from dynamoctl.bench.workload import LengthDist, read_trace
from dynamoctl.settings.base import Options


def _numbers(text: str, kind: type[int] | type[float]) -> list[Any]:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"comma-separated numbers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError("values must be > 0")
    return values


class BenchOptions(Options):
    """The load, its limits and its outputs."""

    FLAGS: ClassVar[dict[str, str]] = {
        "ignore_eos": "ignore-eos/--no-ignore-eos",
        "plots": "plots/--no-plots",
    }

    model: str = ""
    """Model name (default: the recipe's, or the first of /v1/models)."""
    api: Literal["completions", "chat"] = "completions"
    """Which OpenAI API the requests use."""
    text: bool = False
    """Send text prompts (chat always does) instead of token ids."""
    concurrency: str = ""
    """Closed loop: sessions at once, one level per value (1,8,32)."""
    rate: str = ""
    """Open loop: Poisson session arrivals per second, one level per value (5,10)."""
    trace: Path | None = None
    """Mooncake-style JSONL trace to replay."""
    speedup: float = Field(default=1.0, ge=1e-6)
    """Trace replay speed-up."""
    trace_block_size: int = Field(default=512, ge=1)
    """Tokens per trace hash_id."""
    isl: str = "512"
    """New input tokens per turn: N, uniform:A:B, normal:MEAN:STD or exponential:MEAN."""
    osl: str = "128"
    """Output tokens, same forms as --isl."""
    turns: int = Field(default=1, ge=1)
    """Turns per session (history grows each turn)."""
    shared_prefix: int = Field(default=0, ge=0)
    """Tokens of system prompt shared by sessions."""
    prefix_groups: int = Field(default=1, ge=1)
    """Distinct shared prefixes."""
    think_time: float = Field(default=0.0, ge=0.0)
    """Seconds between a reply and the next turn."""
    requests: int = Field(default=0, ge=0)
    """Most requests per level (0: 100, or a trace's size)."""
    duration: float = Field(default=60.0, ge=0.1)
    """Most seconds sending, per level."""
    drain: float = Field(default=30.0, ge=0.0)
    """Then seconds for open requests to end."""
    timeout: float = Field(default=60.0, ge=0.1)
    """Seconds one request may take."""
    max_inflight: int = Field(default=1024, ge=1)
    """Open loop: sessions in flight at most."""
    warmup: int = Field(default=0, ge=0)
    """Unmeasured requests before each level."""
    ttft_slo: float | None = Field(default=None, ge=0.0)
    """Goodput target: TTFT ms."""
    itl_slo: float | None = Field(default=None, ge=0.0)
    """Goodput target: mean ITL ms."""
    seed: int = 0
    """Workload seed."""
    ignore_eos: bool = True
    """Send ignore_eos so outputs have --osl tokens."""
    extra_body: str = "{}"
    """JSON object merged into every request body."""
    header: list[str] = Field(default_factory=list)
    """Extra HTTP header 'NAME: VALUE' (repeatable); an Authorization header given here
    replaces the key bench would send (the recipe's first API key, or $OPENAI_API_KEY)."""
    out: Path | None = None
    """Output directory (default bench-results/TIMESTAMP)."""
    plots: bool = True
    """Write PNG plots (needs matplotlib)."""

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: str) -> str:
        _numbers(value, int)
        return value

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        _numbers(value, float)
        return value

    @field_validator("isl", "osl")
    @classmethod
    def _length(cls, value: str) -> str:
        LengthDist.parse(value)
        return value

    @field_validator("trace")
    @classmethod
    def _trace(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"a JSON object: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("a JSON object, not " + type(parsed).__name__)
        return value

    @field_validator("header")
    @classmethod
    def _header(cls, values: list[str]) -> list[str]:
        for value in values:
            name, sep, _ = value.partition(":")
            if not sep or not name.strip():
                raise ValueError(f"NAME: VALUE, got {value!r}")
        return values

    @model_validator(mode="after")
    def _one_load_shape(self) -> BenchOptions:
        if sum(bool(x) for x in (self.concurrency, self.rate, self.trace)) > 1:
            raise ValueError("give one of --concurrency, --rate, --trace")
        return self

    def headers(self) -> dict[str, str]:
        pairs = (value.partition(":") for value in self.header)
        return {name.strip(): content.strip() for name, _, content in pairs}

    def config(self, target: str) -> BenchConfig:
        """The runner's configuration for ``target``; a trace's size bounds the requests."""
        entries = len(read_trace(self.trace)) if self.trace is not None else 0
        return BenchConfig(
            target=target,
            model=self.model or None,
            api=self.api,
            text=self.text,
            concurrency=_numbers(self.concurrency, int),
            rates=_numbers(self.rate, float),
            trace=str(self.trace) if self.trace is not None else None,
            speedup=self.speedup,
            trace_block_size=self.trace_block_size,
            isl=self.isl,
            osl=self.osl,
            turns=self.turns,
            shared_prefix=self.shared_prefix,
            prefix_groups=self.prefix_groups,
            think_time=self.think_time,
            limits=Limits(
                self.requests or entries or 100, self.duration, self.drain, self.max_inflight
            ),
            timeout=self.timeout,
            slo=Slo(self.ttft_slo, self.itl_slo),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            extra_body=json.loads(self.extra_body),
            headers=self.headers(),
            warmup=self.warmup,
        )
