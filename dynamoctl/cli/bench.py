"""``dynamoctl bench``: load-test an OpenAI-compatible endpoint, write JSON, Markdown, PNGs."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, cast

import typer

EXAMPLES = """Examples:

  dynamoctl bench http://127.0.0.1:8000 --concurrency 1,8,32 --requests 500

  dynamoctl bench recipes/local.yaml --rate 20 --duration 30 --turns 4 --shared-prefix 1024

  dynamoctl bench http://host:8000/v1 --trace mooncake.jsonl --speedup 2 --ttft-slo 500
"""


def _literal(text: str) -> str:
    """``text`` as typed in ``--help``. Typer renders help as rich markup, which reads
    ``:A:`` or ``:M:`` as emoji codes (``uniform:A:B`` showed as ``uniform🅰B``) and has no
    escape for them; an empty tag after each colon splits every such code and renders as
    nothing, not even an ANSI code."""
    if typer.core.DEFAULT_MARKUP_MODE != "rich":  # TYPER_USE_RICH=0: plain click help
        return text
    return text.replace(":", ":[bold][/bold]")


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EXAMPLES)(bench)


def _list(text: str, kind: type[int] | type[float], name: str) -> list[Any]:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"comma-separated numbers, got {text!r}", param_hint=name) from exc
    if any(v <= 0 for v in values):
        raise typer.BadParameter("values must be > 0", param_hint=name)
    return values


def _headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise typer.BadParameter(f"NAME: VALUE, got {value!r}", param_hint="--header")
        headers[name.strip()] = content.strip()
    return headers


def bench(
    target: str = typer.Argument(
        ..., help="Endpoint URL (http://HOST:PORT, /v1 optional) or a recipe file (its frontend)."
    ),
    model: str = typer.Option("", help="Model name. Default: the recipe's, or /v1/models' first."),
    api: str = typer.Option("completions", help="completions or chat."),
    text: bool = typer.Option(
        False, "--text", help="Send text prompts (chat always does) instead of token ids."
    ),
    concurrency: str = typer.Option("", help="Closed loop: sessions at once, e.g. 1,8,32."),
    rate: str = typer.Option("", help="Open loop: Poisson session arrivals per second, e.g. 5,10."),
    trace: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="Mooncake-style JSONL trace to replay."
    ),
    speedup: float = typer.Option(1.0, min=1e-6, help="Trace replay speed-up."),
    trace_block_size: int = typer.Option(512, min=1, help="Tokens per trace hash_id."),
    isl: str = typer.Option(
        "512",
        help=_literal(
            "New input tokens per turn: N, uniform:A:B, normal:MEAN:STD or exponential:MEAN."
        ),
    ),
    osl: str = typer.Option("128", help="Output tokens, same forms as --isl."),
    turns: int = typer.Option(1, min=1, help="Turns per session (history grows each turn)."),
    shared_prefix: int = typer.Option(0, min=0, help="Tokens of system prompt shared by sessions."),
    prefix_groups: int = typer.Option(1, min=1, help="Distinct shared prefixes."),
    think_time: float = typer.Option(0.0, min=0.0, help="Seconds between a reply and next turn."),
    requests: int = typer.Option(
        0, min=0, help="Most requests per level (0: 100, or a trace's size)."
    ),
    duration: float = typer.Option(60.0, min=0.1, help="Most seconds sending, per level."),
    drain: float = typer.Option(30.0, min=0.0, help="Then seconds for open requests to end."),
    timeout: float = typer.Option(60.0, min=0.1, help="Seconds one request may take."),
    max_inflight: int = typer.Option(1024, min=1, help="Open loop: sessions in flight at most."),
    warmup: int = typer.Option(0, min=0, help="Unmeasured requests before each level."),
    ttft_slo: float | None = typer.Option(None, min=0.0, help="Goodput target: TTFT ms."),
    itl_slo: float | None = typer.Option(None, min=0.0, help="Goodput target: mean ITL ms."),
    seed: int = typer.Option(0, help="Workload seed."),
    ignore_eos: bool = typer.Option(True, help="Send ignore_eos so outputs have --osl tokens."),
    extra_body: str = typer.Option("{}", help="JSON object merged into every request body."),
    header: list[str] = typer.Option([], help="Extra HTTP header 'NAME: VALUE' (repeatable)."),
    out: Path | None = typer.Option(
        None, help="Output directory (default bench-results/TIMESTAMP)."
    ),
    plots: bool = typer.Option(True, help="Write PNG plots (needs matplotlib)."),
) -> None:
    """Benchmark an OpenAI-compatible endpoint (ours, vLLM's, Dynamo's): TTFT, ITL,
    latency, throughput, goodput, errors, prefix hits. Bounded by --requests and
    --duration per level; nothing is started, the endpoint must be up."""
    import asyncio

    from rich.console import Console

    from dynamoctl.bench.http import ProtocolError
    from dynamoctl.bench.plots import PlottingUnavailable, require_matplotlib
    from dynamoctl.bench.report import summary_table, write_report
    from dynamoctl.bench.runner import BenchConfig, run_bench
    from dynamoctl.bench.schedule import Limits
    from dynamoctl.bench.stats import Slo
    from dynamoctl.bench.workload import LengthDist, read_trace
    from dynamoctl.recipe.loader import RecipeError

    if api not in ("completions", "chat"):
        raise typer.BadParameter(f"completions or chat, got {api!r}", param_hint="--api")
    if sum(bool(x) for x in (concurrency, rate, trace)) > 1:
        raise typer.BadParameter("give one of --concurrency, --rate, --trace")
    for name, value in (("--isl", isl), ("--osl", osl)):
        try:
            LengthDist.parse(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=name) from exc
    try:
        extra = json.loads(extra_body)
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise typer.BadParameter(f"a JSON object: {exc}", param_hint="--extra-body") from exc
    if plots:
        try:
            require_matplotlib()
        except PlottingUnavailable as exc:
            typer.echo(f"dynamoctl bench: {exc}", err=True)
            raise typer.Exit(1) from exc
    try:
        entries = len(read_trace(trace)) if trace is not None else 0
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace") from exc
    config = BenchConfig(
        target=target,
        model=model or None,
        api=cast(Any, api),
        text=text,
        concurrency=_list(concurrency, int, "--concurrency") if concurrency else [],
        rates=_list(rate, float, "--rate") if rate else [],
        trace=str(trace) if trace is not None else None,
        speedup=speedup,
        trace_block_size=trace_block_size,
        isl=isl,
        osl=osl,
        turns=turns,
        shared_prefix=shared_prefix,
        prefix_groups=prefix_groups,
        think_time=think_time,
        limits=Limits(requests or entries or 100, duration, drain, max_inflight),
        timeout=timeout,
        slo=Slo(ttft_slo, itl_slo),
        seed=seed,
        ignore_eos=ignore_eos,
        extra_body=extra,
        headers=_headers(header),
        warmup=warmup,
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out or Path("bench-results") / stamp
    console = Console(stderr=True)
    try:
        result = asyncio.run(run_bench(config, console=console))
    except (OSError, ValueError, RecipeError, ProtocolError) as exc:
        typer.echo(f"dynamoctl bench: {exc}", err=True)
        raise typer.Exit(1) from exc
    files = write_report(result, out_dir, plots=plots)
    typer.echo(summary_table([run.summary for run in result.runs]), nl=False)
    typer.echo(f"wrote {', '.join(str(f) for f in files)}")
    failed = sum(run.summary.completed == 0 for run in result.runs)
    if failed:
        raise typer.Exit(1)
