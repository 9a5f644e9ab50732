"""``dynamoctl bench``: load-test an OpenAI-compatible endpoint, write JSON, Markdown, PNGs.

Its flags are :class:`dynamoctl.bench.options.BenchOptions`' fields (declared once)."""

from __future__ import annotations

import datetime
from pathlib import Path

import typer

from dynamoctl.bench.options import BenchOptions
from dynamoctl.settings import with_options

EXAMPLES = """Examples:

  dynamoctl bench http://127.0.0.1:8000 --concurrency 1,8,32 --requests 500

  dynamoctl bench recipes/local.yaml --rate 20 --duration 30 --turns 4 --shared-prefix 1024

  dynamoctl bench http://host:8000/v1 --trace mooncake.jsonl --speedup 2 --ttft-slo 500
"""


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EXAMPLES)(with_options(bench, options=BenchOptions))


def bench(
    target: str = typer.Argument(
        ..., help="Endpoint URL (http://HOST:PORT, /v1 optional) or a recipe file (its frontend)."
    ),
    *,
    options: BenchOptions,
) -> None:
    """Benchmark an OpenAI-compatible endpoint (ours, vLLM's, Dynamo's): TTFT, ITL,
    latency, throughput, goodput, errors, prefix hits. Bounded by --requests and
    --duration per level; nothing is started, the endpoint must be up. Sends the recipe's
    first API key, or $OPENAI_API_KEY for a URL, when there is one."""
    import asyncio

    from rich.console import Console

    from dynamoctl.bench.http import ProtocolError
    from dynamoctl.bench.plots import PlottingUnavailable, require_matplotlib
    from dynamoctl.bench.report import summary_table, write_report
    from dynamoctl.bench.runner import run_bench
    from dynamoctl.recipe.loader import RecipeError

    if options.plots:
        try:
            require_matplotlib()
        except PlottingUnavailable as exc:
            typer.echo(f"dynamoctl bench: {exc}", err=True)
            raise typer.Exit(1) from exc
    try:
        config = options.config(target)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace") from exc
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = options.out or Path("bench-results") / stamp
    try:
        result = asyncio.run(run_bench(config, console=Console(stderr=True)))
    except (OSError, ValueError, RecipeError, ProtocolError) as exc:
        typer.echo(f"dynamoctl bench: {exc}", err=True)
        raise typer.Exit(1) from exc
    files = write_report(result, out_dir, plots=options.plots)
    typer.echo(summary_table([run.summary for run in result.runs]), nl=False)
    typer.echo(f"wrote {', '.join(str(f) for f in files)}")
    if any(run.summary.completed == 0 for run in result.runs):
        raise typer.Exit(1)
