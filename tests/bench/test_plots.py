"""Plots say what they show: a title and the workload on every figure, the levels run as
linear ticks of the concurrency (or rate) axis, and latency against throughput.

Asserted on matplotlib's figure objects (Agg), not on pixels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from dynamoctl.bench import plots
from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.report import write_report
from dynamoctl.bench.result import BenchResult, RunResult
from dynamoctl.bench.schedule import RunOutcome
from dynamoctl.bench.stats import Slo, summarize

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LEVELS = (1, 8, 32)
WORKLOAD: dict[str, Any] = {
    "isl": "uniform:64:256",
    "osl": "normal:128:16",
    "ignore_eos": True,
    "turns": 3,
    "shared_prefix": 0,
    "limits": {"max_requests": 40, "max_seconds": 30.0},
}


def records(level: int) -> list[RequestRecord]:
    """Latency grows with the level, as a queue would make it."""
    return [
        RequestRecord(
            session=i,
            turn=0,
            start=i * 0.1,
            ttft=0.002 * level * (1 + i % 4),
            e2e=0.05 + 0.004 * level * (1 + i % 4),
            gaps=[0.003, 0.004],
            output_tokens=3,
            prompt_tokens=100,
            cached_tokens=0,
        )
        for i in range(40)
    ]


def sweep(rates: bool = False) -> BenchResult:
    runs = []
    for n, level in enumerate(LEVELS):
        outcome = RunOutcome(records(level), issued=40, duration=4.0 / (n + 1))
        if rates:
            summary = summarize(outcome, Slo(), label=f"rate={level}/s", rate=float(level))
        else:
            summary = summarize(outcome, Slo(), label=f"c={level}", concurrency=level)
        runs.append(RunResult(summary, outcome.records))
    return BenchResult(version="0", started_at="2026-01-01T00:00:00+00:00", endpoint="http://x",
                       model="m", api="completions", workload=WORKLOAD, runs=runs)  # fmt: skip


def captions(fig: Any) -> list[Any]:
    """The figure's own texts but its title."""
    return [t for t in fig.texts if t.get_text() != fig.get_suptitle()]


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure written to a file from now on, by file name: the figures behind the
    PNGs, inspected after they were saved and closed."""
    figures: dict[str, Any] = {}
    original = Figure.savefig

    def record(fig: Figure, fname: Any, *args: Any, **kw: Any) -> None:
        figures[Path(fname).name] = fig
        original(fig, fname, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


@pytest.fixture
def figures(saved: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    write_report(sweep(), tmp_path, plots=True)
    return saved


def test_every_figure_has_a_title_and_the_workload(figures: dict[str, Any]) -> None:
    for name, fig in figures.items():
        assert fig.get_suptitle(), name
        caption = " ".join(t.get_text() for t in captions(fig)).replace("\n", " ")
        for fact in ("closed loop, concurrency 1, 8, 32", "ISL uniform:64:256", "OSL normal:128:16",
                     "3 turns", "no shared prefix", "≤ 40 requests and ≤ 30 s",
                     "ran 1.3 to 4.0 s", "model m at http://x"):  # fmt: skip
            assert fact in caption, (name, fact, caption)
        for ax in fig.axes:
            assert ax.get_title(), name
        # the caption is below the axes, not over them
        renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
        caption_top = max(t.get_window_extent(renderer).y1 for t in captions(fig))
        lowest_axes = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes)
        assert caption_top <= lowest_axes, name
    assert set(figures) == {"latency_cdf.png", "throughput.png", "ttft_over_time.png",
                            "latency_vs_throughput.png"}  # fmt: skip


def test_concurrency_axis_is_linear_with_the_levels_as_ticks(figures: dict[str, Any]) -> None:
    for ax in figures["throughput.png"].axes:
        assert ax.get_xscale() == "linear"
        assert list(ax.get_xticks()) == list(LEVELS)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8", "32"]
        assert ax.get_xlabel().startswith("concurrency")


def test_rate_axis_has_the_rates_as_ticks(saved: dict[str, Any], tmp_path: Path) -> None:
    plots.throughput(sweep(rates=True), tmp_path / "rates.png")
    fig = saved["rates.png"]
    for ax in fig.axes:
        assert ax.get_xscale() == "linear"
        assert list(ax.get_xticks()) == list(LEVELS)
        assert ax.get_xlabel().startswith("request rate")
    caption = " ".join(t.get_text() for t in captions(fig)).replace("\n", " ")
    assert "open loop, Poisson arrivals at 1, 8, 32 sessions/s" in caption


def test_latency_against_throughput(figures: dict[str, Any]) -> None:
    ttft, e2e = figures["latency_vs_throughput.png"].axes
    result = sweep()
    throughputs = [run.summary.output_token_throughput for run in result.runs]
    for ax, dist in ((ttft, "ttft_ms"), (e2e, "e2e_ms")):
        assert "output tokens/s" in ax.get_xlabel()
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"p50", "p99"}
        for q, line in lines.items():
            assert list(line.get_xdata()) == throughputs
            want = [getattr(getattr(run.summary, dist), q) for run in result.runs]
            assert list(line.get_ydata()) == want
        assert [t.get_text() for t in ax.texts] == ["c=1", "c=8", "c=32"]  # each point's level


def test_report_links_the_latency_throughput_plot(figures: dict[str, Any], tmp_path: Path) -> None:
    assert (tmp_path / "latency_vs_throughput.png").read_bytes().startswith(b"\x89PNG")
    md = (tmp_path / "report.md").read_text()
    assert "![latency_vs_throughput](latency_vs_throughput.png)" in md


def test_a_trace_replay_is_one_labelled_slot(saved: dict[str, Any], tmp_path: Path) -> None:
    one = sweep().runs[0]
    trace = RunResult(msgspec.structs.replace(one.summary, concurrency=None, label="trace x2"),
                      one.requests)  # fmt: skip
    workload = {**WORKLOAD, "trace": "/data/mooncake.jsonl", "speedup": 2.0}
    result = msgspec.structs.replace(sweep(), runs=[trace], workload=workload)
    write_report(result, tmp_path, plots=True)
    for ax in saved["throughput.png"].axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["trace x2"]
    caption = " ".join(t.get_text() for t in captions(saved["throughput.png"]))
    assert "trace replay of mooncake.jsonl at x2" in caption.replace("\n", " ")
    assert "no shared prefix" not in caption  # the trace's prefixes are its own
