"""A benchmark's results as files: ``results.json`` (every summary and request record,
``result.py``), ``report.md`` (a table per run) and PNG plots (``plots.py``), all in one
directory."""

from __future__ import annotations

from pathlib import Path

from dynamoctl.bench.result import BenchResult, write_json
from dynamoctl.bench.stats import Summary


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def summary_table(summaries: list[Summary]) -> str:
    """One Markdown row per run: load, throughput, goodput, latency percentiles, errors."""
    head = (
        "| run | sent | ok | req/s | output tok/s | goodput req/s | TTFT p50 / p90 / p99 ms "
        "| ITL p50 / p99 ms | TPOT p50 ms | E2E p50 / p99 ms | prefix hit | errors |"
    )
    rows = [head, "|" + "---|" * 12]
    for s in summaries:
        errors = ", ".join(f"{k} {v}" for k, v in s.errors.items()) or "none"
        hit = "—" if s.prefix_hit_rate is None else f"{s.prefix_hit_rate:.1%}"
        rows.append(
            f"| {s.label} | {s.requests_sent} | {s.completed} | {_fmt(s.request_throughput)} "
            f"| {_fmt(s.output_token_throughput, 0)} | {_fmt(s.goodput)} "
            f"| {_fmt(s.ttft_ms.p50)} / {_fmt(s.ttft_ms.p90)} / {_fmt(s.ttft_ms.p99)} "
            f"| {_fmt(s.itl_ms.p50, 2)} / {_fmt(s.itl_ms.p99, 2)} | {_fmt(s.tpot_ms.p50, 2)} "
            f"| {_fmt(s.e2e_ms.p50)} / {_fmt(s.e2e_ms.p99)} | {hit} | {errors} |"
        )
    return "\n".join(rows) + "\n"


def markdown(result: BenchResult, images: list[str]) -> str:
    summaries = [run.summary for run in result.runs]
    slo = summaries[0].slo if summaries else None
    targets = []
    if slo is not None and slo.ttft_ms is not None:
        targets.append(f"TTFT ≤ {slo.ttft_ms:g} ms")
    if slo is not None and slo.itl_ms is not None:
        targets.append(f"TPOT ≤ {slo.itl_ms:g} ms")
    workload = ", ".join(f"{k}={v}" for k, v in result.workload.items() if v not in (None, ""))
    lines = [
        f"# Benchmark of {result.endpoint}",
        "",
        f"- model `{result.model}`, API `{result.api}`, started {result.started_at}, "
        f"dynamoctl {result.version}",
        f"- workload: {workload}",
        f"- goodput targets: {' and '.join(targets) if targets else 'none given'}",
        "",
        summary_table(summaries),
        "TTFT: start to first text chunk. ITL: gap between text chunks. TPOT: a request's "
        "mean ITL. E2E: start to end of stream. Prefix hit: cached / prompt tokens "
        "(`usage.prompt_tokens_details.cached_tokens`).",
        "",
    ]
    lines += [f"![{Path(name).stem}]({name})" for name in images]
    return "\n".join(lines).rstrip() + "\n"


def write_report(result: BenchResult, out: Path, *, plots: bool) -> list[Path]:
    """Write results.json, report.md and (with ``plots``) the PNGs; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    write_json(result, written[0])
    images: list[Path] = []
    if plots:
        from dynamoctl.bench.plots import plot_all

        images = plot_all(result, out)
    md = out / "report.md"
    md.write_text(markdown(result, [p.name for p in images]), encoding="utf-8")
    return [*written, md, *images]
