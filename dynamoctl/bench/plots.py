"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

Every figure has a title and a caption describing the load that produced it (mode and
levels, ISL/OSL, turns, shared prefix, bounds per level, target): a PNG is often read
without its report, and the same curves mean different things under different loads.
Builders (``*_figure``) return the figure, so tests can inspect it; the other functions
save it.

matplotlib is an optional dependency (``pip install 'dynamoctl[bench]'``); the CLI checks
for it before any load is sent, so a missing plotter never wastes a run.
"""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dynamoctl.bench.result import BenchResult
    from dynamoctl.bench.stats import Summary

INSTALL_HINT = "pip install 'dynamoctl[bench]'"
CAPTION_PT = 8
TITLE_IN = 0.3
"""Inches the figure grows by for its title (tight_layout places the axes below it)."""


class PlottingUnavailable(RuntimeError):
    pass


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise PlottingUnavailable(f"plots need matplotlib: {INSTALL_HINT} (or pass --no-plots)")


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load_mode(result: BenchResult) -> str:
    summaries = [run.summary for run in result.runs]
    trace = result.workload.get("trace")
    if summaries and all(s.concurrency is not None for s in summaries):
        return "closed loop, concurrency " + ", ".join(str(s.concurrency) for s in summaries)
    if summaries and all(s.rate is not None for s in summaries):
        rates = ", ".join(f"{s.rate:g}" for s in summaries)
        return f"open loop, Poisson arrivals at {rates} sessions/s"
    if trace:
        return f"trace replay of {Path(str(trace)).name} at x{result.workload.get('speedup', 1):g}"
    return "runs " + ", ".join(s.label for s in summaries)


def _synthetic(w: dict[str, Any]) -> list[str]:
    parts = []
    if "isl" in w or "osl" in w:
        eos = " (ignore_eos)" if w.get("ignore_eos") else ""
        parts.append(f"ISL {w.get('isl', '?')} new tokens/turn, OSL {w.get('osl', '?')}{eos}")
    turns = int(w.get("turns", 1))
    if turns > 1:
        think = float(w.get("think_time", 0.0))
        parts.append(f"{turns} turns/session" + (f", {think:g} s think time" if think else ""))
    if w.get("shared_prefix"):
        groups = w.get("prefix_groups", 1)
        parts.append(f"shared prefix {w['shared_prefix']} tokens x {groups} groups")
    elif "shared_prefix" in w:
        parts.append("no shared prefix")
    return parts


def workload_caption(result: BenchResult) -> str:
    """One paragraph: what load ran, how long, against what. Keys missing from
    ``result.workload`` (scripts build their own) are left out, not guessed."""
    w = result.workload
    parts = [_load_mode(result)]
    if w.get("trace"):  # lengths and prefixes are the trace's, not the synthetic options'
        parts.append(f"ISL/OSL from the trace ({w.get('trace_block_size', 512)}-token blocks)")
    else:
        parts += _synthetic(w)
    durations = [run.summary.duration_s for run in result.runs]
    low, high = f"{min(durations, default=0):.1f}", f"{max(durations, default=0):.1f}"
    ran = "" if not durations else f"ran {low} s" if low == high else f"ran {low} to {high} s"
    limits = w.get("limits")
    if isinstance(limits, dict) and {"max_requests", "max_seconds"} <= limits.keys():
        bound = f"≤ {limits['max_requests']} requests and ≤ {limits['max_seconds']:g} s"
        parts.append(f"per level {bound} ({ran})" if ran else f"per level {bound}")
    elif ran:
        parts.append(f"per level {ran}")
    slo = w.get("slo")
    slo = slo if isinstance(slo, dict) else {}
    names = {"ttft_ms": "TTFT", "itl_ms": "TPOT"}
    targets = [f"{names[k]} ≤ {slo[k]:g} ms" for k in names if slo.get(k) is not None]
    if targets:
        parts.append("goodput: " + " and ".join(targets))
    prompts = "text" if w.get("text") or result.api == "chat" else "token-id"
    parts.append(f"{result.api} API, {prompts} prompts")
    seed = f", seed {w['seed']}" if "seed" in w else ""
    when = f", {result.started_at}" if result.started_at else ""
    parts.append(f"model {result.model} at {result.endpoint}{when}{seed}")
    parts.append(f"dynamoctl {result.version}")
    return "; ".join(parts) + "."


def _finish(fig: Figure, result: BenchResult, title: str) -> Figure:
    """Add the title above and the workload caption below, growing the figure by the room
    they take so the axes keep their size."""
    width, height = fig.get_size_inches()
    caption = textwrap.fill(workload_caption(result), width=int(width * 15))
    caption_in = (caption.count("\n") + 1) * CAPTION_PT * 1.35 / 72 + 0.2
    total = height + caption_in + TITLE_IN
    fig.set_size_inches(width, total)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.text(0.01, 0.1 / total, caption, fontsize=CAPTION_PT, color="0.3", va="bottom")
    fig.tight_layout(rect=(0, caption_in / total, 1, 1))
    return fig


def _save(fig: Figure, path: Path) -> Path:
    plt = _pyplot()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _levels(summaries: list[Summary]) -> tuple[list[float], list[str], str]:
    """x positions, tick labels and axis label of the runs: the concurrency or rate each
    ran at, linear with one tick per level (a log axis dropped ticks such as 8 and spread
    1, 8, 32 misleadingly); for traces or mixed runs, one slot per run."""
    if summaries and all(s.concurrency is not None for s in summaries):
        xs = [float(s.concurrency or 0) for s in summaries]
        return xs, [f"{x:g}" for x in xs], "concurrency (sessions at once)"
    if summaries and all(s.rate is not None for s in summaries):
        xs = [float(s.rate or 0) for s in summaries]
        return xs, [f"{x:g}" for x in xs], "request rate (sessions/s)"
    return [float(i) for i in range(len(summaries))], [s.label for s in summaries], "run"


def _level_axis(ax: Axes, summaries: list[Summary]) -> None:
    xs, labels, name = _levels(summaries)
    ax.set_xscale("linear")
    ax.set_xticks(xs, labels)
    if name != "run":
        ax.set_xlim(0, max(xs, default=1) * 1.05)
    ax.set_xlabel(name)


def _cdf(ax: Axes, values_ms: list[float], label: str) -> None:
    ordered = sorted(values_ms)
    if ordered:
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label)


def latency_cdf_figure(result: BenchResult) -> Figure:
    """TTFT, ITL and end-to-end latency CDFs, one line per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for run in result.runs:
        ok = [r for r in run.requests if r.error is None]
        label = run.summary.label
        _cdf(axes[0], [r.ttft * 1e3 for r in ok if r.ttft is not None], label)
        _cdf(axes[1], [g * 1e3 for r in ok for g in r.gaps], label)
        _cdf(axes[2], [r.e2e * 1e3 for r in ok if r.e2e is not None], label)
    itl_p99 = max((run.summary.itl_ms.p99 for run in result.runs), default=0.0)
    if itl_p99 > 0:  # chunk gaps are heavy-tailed: show the body, not the longest stall
        axes[1].set_xlim(0, itl_p99 * 1.2)
    for ax, title in zip(axes, ("TTFT", "ITL (to 1.2 x p99)", "end-to-end"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of gaps" if title.startswith("ITL") else "fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return _finish(fig, result, "Latency distributions (CDF)")


def throughput_figure(result: BenchResult) -> Figure:
    """Requests/s (and goodput) and output tokens/s against each run's concurrency or rate."""
    plt = _pyplot()
    summaries = [run.summary for run in result.runs]
    xs, _, _ = _levels(summaries)
    fig, (reqs, tokens) = plt.subplots(1, 2, figsize=(10, 3.8))
    reqs.plot(xs, [s.request_throughput for s in summaries], "o-", label="requests/s")
    if any(s.goodput is not None for s in summaries):
        reqs.plot(xs, [s.goodput or 0 for s in summaries], "s--", label="goodput")
    tokens.plot(xs, [s.output_token_throughput for s in summaries], "^-", color="tab:green")
    reqs.set_title("requests per second")
    tokens.set_title("output tokens per second")
    reqs.set_ylabel("requests/s")
    tokens.set_ylabel("output tokens/s")
    reqs.legend(fontsize="small")
    for ax in (reqs, tokens):
        _level_axis(ax, summaries)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    return _finish(fig, result, "Throughput by load level")


def ttft_over_time_figure(result: BenchResult) -> Figure:
    """Each request's TTFT at its start time: shows warm-up, queue build-up and stalls."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    title = "each request's TTFT at its start"
    for run in result.runs:
        points = [(r.start, r.ttft * 1e3) for r in run.requests if r.ttft is not None]
        ax.scatter([x for x, _ in points], [y for _, y in points], s=4, label=run.summary.label)
        failed = [r for r in run.requests if r.error is not None]
        if failed:
            ax.scatter([r.start for r in failed], [0] * len(failed), marker="x", color="red", s=12)
            title = "each request's TTFT at its start (red x at 0: failed requests)"
    ax.set_title(title)
    ax.set_xlabel("request start (s since run start)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", markerscale=3)
    return _finish(fig, result, "TTFT over time")


def latency_vs_throughput_figure(result: BenchResult) -> Figure:
    """TTFT and end-to-end p50 / p99 against output tokens/s, one point per level (labelled):
    the latency a throughput costs, the trade-off a sweep is run to find."""
    plt = _pyplot()
    summaries = [run.summary for run in result.runs if run.summary.completed]
    xs = [s.output_token_throughput for s in summaries]
    fig, (ttft, e2e) = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, name, dist in ((ttft, "TTFT", "ttft_ms"), (e2e, "end-to-end", "e2e_ms")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ys = [getattr(getattr(s, dist), q) for s in summaries]
            ax.plot(xs, ys, style, label=q)
            if q == "p99":
                for s, x, y in zip(summaries, xs, ys, strict=True):
                    ax.annotate(s.label, (x, y), textcoords="offset points", xytext=(4, 4),
                                fontsize="small")  # fmt: skip
        ax.set_title(f"{name} latency")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{name} (ms)")
        ax.margins(0.1)  # room for the labels of the outermost points
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _finish(fig, result, "Latency vs throughput")


def latency_cdfs(result: BenchResult, path: Path) -> Path:
    return _save(latency_cdf_figure(result), path)


def throughput(result: BenchResult, path: Path) -> Path:
    return _save(throughput_figure(result), path)


def ttft_over_time(result: BenchResult, path: Path) -> Path:
    return _save(ttft_over_time_figure(result), path)


def latency_vs_throughput(result: BenchResult, path: Path) -> Path:
    return _save(latency_vs_throughput_figure(result), path)


PLOTS: dict[str, Callable[[BenchResult], Figure]] = {
    "latency_cdf.png": latency_cdf_figure,
    "throughput.png": throughput_figure,
    "ttft_over_time.png": ttft_over_time_figure,
    "latency_vs_throughput.png": latency_vs_throughput_figure,
}
"""File name -> figure builder: everything ``plot_all`` writes."""


def plot_all(result: BenchResult, out: Path) -> list[Path]:
    return [_save(build(result), out / name) for name, build in PLOTS.items()]
