"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

matplotlib is an optional dependency (``pip install 'dynamoctl[bench]'``); the CLI checks
for it before any load is sent, so a missing plotter never wastes a run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamoctl.bench.report import BenchResult

INSTALL_HINT = "pip install 'dynamoctl[bench]'"


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


def _cdf(ax: Any, values_ms: list[float], label: str) -> None:
    ordered = sorted(values_ms)
    if ordered:
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label)


def latency_cdfs(result: BenchResult, path: Path) -> Path:
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
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def throughput(result: BenchResult, path: Path) -> Path:
    """Requests/s (and goodput) and output tokens/s against each run's concurrency or rate."""
    plt = _pyplot()
    summaries = [run.summary for run in result.runs]
    by_rate = all(s.concurrency is None and s.rate is not None for s in summaries)
    xs = [(s.rate if by_rate else s.concurrency) or 0 for s in summaries]
    fig, (reqs, tokens) = plt.subplots(1, 2, figsize=(10, 3.8))
    reqs.plot(xs, [s.request_throughput for s in summaries], "o-", label="requests/s")
    if any(s.goodput is not None for s in summaries):
        reqs.plot(xs, [s.goodput or 0 for s in summaries], "s--", label="goodput")
    tokens.plot(xs, [s.output_token_throughput for s in summaries], "^-", color="tab:green")
    reqs.set_ylabel("requests/s")
    tokens.set_ylabel("output tokens/s")
    reqs.legend(fontsize="small")
    for ax in (reqs, tokens):
        ax.set_xlabel("request rate (sessions/s)" if by_rate else "concurrency")
        if not by_rate and len(set(xs)) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def ttft_over_time(result: BenchResult, path: Path) -> Path:
    """Each request's TTFT at its start time: shows warm-up, queue build-up and stalls."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for run in result.runs:
        points = [(r.start, r.ttft * 1e3) for r in run.requests if r.ttft is not None]
        ax.scatter([x for x, _ in points], [y for _, y in points], s=4, label=run.summary.label)
        failed = [r for r in run.requests if r.error is not None]
        if failed:
            ax.scatter([r.start for r in failed], [0] * len(failed), marker="x", color="red", s=12)
    ax.set_xlabel("request start (s since run start)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_all(result: BenchResult, out: Path) -> list[Path]:
    return [
        latency_cdfs(result, out / "latency_cdf.png"),
        throughput(result, out / "throughput.png"),
        ttft_over_time(result, out / "ttft_over_time.png"),
    ]
