"""A whole benchmark: resolve the target, run each load level, summarise, with progress.

The target is a URL or a recipe; from a recipe we read where its frontend listens and
which model it serves, and benchmark that endpoint without starting anything.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dynamoctl import __version__
from dynamoctl.bench.client import RequestRecord, Sender
from dynamoctl.bench.clock import Clock, LoopClock
from dynamoctl.bench.http import Endpoint, get_json_bytes
from dynamoctl.bench.result import BenchResult, RunResult
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.bench.workload import (
    Api,
    LengthDist,
    Session,
    poisson_arrivals,
    read_trace,
    synthetic_sessions,
    trace_sessions,
)


class BenchConfig(msgspec.Struct, kw_only=True):
    target: str
    model: str | None = None
    api: Api = "completions"
    text: bool = False
    concurrency: list[int] = []
    rates: list[float] = []
    trace: str | None = None
    speedup: float = 1.0
    trace_block_size: int = 512
    isl: str = "512"
    osl: str = "128"
    turns: int = 1
    shared_prefix: int = 0
    prefix_groups: int = 1
    think_time: float = 0.0
    limits: Limits = Limits()
    timeout: float = 60.0
    slo: Slo = Slo()
    seed: int = 0
    ignore_eos: bool = True
    extra_body: dict[str, Any] = {}
    headers: dict[str, str] = {}
    warmup: int = 0

    def levels(self) -> list[tuple[str, int | None, float | None]]:
        """(label, concurrency, rate) of each run, in order."""
        if self.trace is not None:
            return [(f"trace x{self.speedup:g}", None, None)]
        if self.rates:
            return [(f"rate={r:g}/s", None, r) for r in self.rates]
        return [(f"c={c}", c, None) for c in self.concurrency or [1]]


class Target(NamedTuple):
    """What a benchmark's target resolves to."""

    endpoint: Endpoint
    model: str | None
    """The recipe's model (None for a URL: ``/v1/models`` says)."""
    api_key: str | None
    """Sent as a bearer token: the recipe's first API key, or ``$OPENAI_API_KEY`` (as
    OpenAI's clients read it) for a URL."""


def endpoint_of(target: str) -> Target:
    """The endpoint, model and API key of a URL (it may end in ``/v1``) or a recipe."""
    if Path(target).is_file():
        from dynamoctl.plan.build import PlanError, client_endpoint
        from dynamoctl.recipe.loader import load_recipe

        recipe = load_recipe(target)
        try:
            url = client_endpoint(recipe)
        except PlanError as exc:
            raise ValueError(f"{target}: {exc}; pass the endpoint's URL instead") from exc
        keys = recipe.frontend.load_api_keys()  # a named source without a key: ValueError
        return Target(Endpoint(url.removesuffix("/v1")), recipe.model.name, next(iter(keys), None))
    url = target.rstrip("/")
    return Target(Endpoint(url.removesuffix("/v1")), None, os.environ.get("OPENAI_API_KEY") or None)


def authorized(headers: dict[str, str], api_key: str | None) -> dict[str, str]:
    """``headers`` with the API key as a bearer token, unless they carry their own."""
    if api_key is None or any(name.lower() == "authorization" for name in headers):
        return headers
    return {"Authorization": f"Bearer {api_key}", **headers}


async def served_model(endpoint: Endpoint, headers: dict[str, str]) -> str:
    """The first model of ``GET /v1/models``."""
    status, body = await get_json_bytes(endpoint, "/v1/models", headers)
    if status != 200:
        raise ValueError(f"{endpoint.base_url}/v1/models answered HTTP {status}")
    data = msgspec.json.decode(body).get("data") or []
    if not data:
        raise ValueError(f"{endpoint.base_url} serves no model yet")
    return str(data[0]["id"])


def sessions_for(
    config: BenchConfig, rate: float | None, seed: int, level: int = 0
) -> Iterator[Session]:
    """The sessions of one load level: ``level`` (its index in the sweep) gives each level
    fresh prompts, so a level's prefix hits are its own, not the previous level's."""
    if config.trace is not None:
        return trace_sessions(read_trace(config.trace), config.speedup, config.trace_block_size)
    sessions = synthetic_sessions(
        LengthDist.parse(config.isl),
        LengthDist.parse(config.osl),
        turns=config.turns,
        shared_prefix=config.shared_prefix,
        prefix_groups=config.prefix_groups,
        seed=seed,
        level=level,
    )
    return poisson_arrivals(sessions, rate, seed) if rate is not None else sessions


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        disable=not console.is_terminal,
    )


class _Tally:
    """Live counters shown next to the progress bar."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.began = clock.now()
        self.ok = self.errors = 0

    def add(self, record: RequestRecord) -> str:
        if record.error is None:
            self.ok += 1
        else:
            self.errors += 1
        rate = self.ok / max(1e-9, self.clock.now() - self.began)
        return f"ok {self.ok}  errors {self.errors}  {rate:.1f} req/s"


async def _run_levels(
    config: BenchConfig,
    sender: Sender,
    console: Console,
    clock: Clock,
    on_run: Callable[[RunResult], None] | None,
) -> list[RunResult]:
    runs: list[RunResult] = []
    for level, (label, concurrency, rate) in enumerate(config.levels()):
        if config.warmup and config.trace is None:
            warm = sessions_for(config, None, config.seed + 1_000_003, level)
            limits = Limits(config.warmup, config.limits.max_seconds, config.limits.drain_seconds)
            await drive(warm, sender.send, clock=clock, limits=limits,
                        concurrency=min(config.warmup, concurrency or 8), api=config.api,
                        text=config.text)  # fmt: skip
        with _progress(console) as progress:
            task = progress.add_task(label, total=config.limits.max_requests, stats="")
            tally = _Tally(clock)

            def update(record: RequestRecord, task: Any = task, tally: _Tally = tally) -> None:
                progress.update(task, advance=1, stats=tally.add(record))

            outcome = await drive(
                sessions_for(config, rate, config.seed, level),
                sender.send,
                clock=clock,
                limits=config.limits,
                concurrency=concurrency,
                api=config.api,
                text=config.text,
                think_time=config.think_time,
                on_record=update,
            )
        summary = summarize(outcome, config.slo, label=label, concurrency=concurrency, rate=rate)
        runs.append(RunResult(summary, outcome.records))
        if on_run is not None:
            on_run(runs[-1])
    return runs


async def run_bench(
    config: BenchConfig,
    *,
    console: Console | None = None,
    clock: Clock | None = None,
    on_run: Callable[[RunResult], None] | None = None,
) -> BenchResult:
    """Run every level of ``config`` one after the other and return all results."""
    console = console or Console(stderr=True)
    clock = clock or LoopClock()
    endpoint, recipe_model, api_key = endpoint_of(config.target)
    headers = authorized(config.headers, api_key)
    model = config.model or recipe_model or await served_model(endpoint, headers)
    sender = Sender(
        endpoint, model, clock, api=config.api, timeout=config.timeout,
        ignore_eos=config.ignore_eos, extra_body=config.extra_body, headers=headers,
    )  # fmt: skip
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        runs = await _run_levels(config, sender, console, clock, on_run)
    finally:
        await endpoint.close()
    workload = {k: v for k, v in msgspec.structs.asdict(config).items() if k != "headers"}
    workload["limits"] = msgspec.structs.asdict(config.limits)
    workload["slo"] = msgspec.structs.asdict(config.slo)
    return BenchResult(
        version=__version__,
        started_at=started,
        endpoint=endpoint.base_url,
        model=model,
        api=config.api,
        workload=workload,
        runs=runs,
    )
