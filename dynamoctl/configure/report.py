"""How an answer is shown: the rich table of top configurations with the agg-vs-disagg
verdict, and the Pareto plot (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from dynamoctl.configure.models import Answer, Candidate


def candidates_table(answer: Answer, chosen: Candidate | None) -> Table:
    q = answer.question
    table = Table(
        title=(
            f"{q.model} on {q.gpus} x {q.system}, {q.engine} {answer.engine_version}: "
            f"ISL {q.isl}, OSL {q.osl}, TTFT <= {q.ttft_ms:g} ms, TPOT <= {q.tpot_ms:g} ms"
        ),
        caption=answer.verdict(),
    )
    for header in ("", "#", "configuration", "GPUs/unit", "units", "conc/unit"):
        table.add_column(header)
    for header in ("TTFT ms", "TPOT ms", "tok/s/GPU", "tok/s/user"):
        table.add_column(header, justify="right")
    for c in answer.candidates:
        p = c.predicted
        table.add_row(
            "*" if c is chosen else "", str(c.rank), c.label(), str(c.gpus_per_unit),
            str(c.units), str(c.concurrency), f"{p.ttft_ms:.0f}", f"{p.tpot_ms:.1f}",
            f"{p.tokens_per_s_gpu:.1f}", f"{p.tokens_per_s_user:.1f}",
        )  # fmt: skip
    return table


def pareto_plot(answer: Answer, chosen: Candidate | None, path: Path) -> Path:
    """Throughput per GPU against throughput per user, one front per mode, the chosen
    configuration marked, the TPOT target as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = answer.question
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for mode, points in answer.fronts.items():
            ordered = sorted(points, key=lambda p: p.tokens_per_s_user)
            ax.plot(
                [p.tokens_per_s_user for p in ordered], [p.tokens_per_s_gpu for p in ordered],
                marker="o", markersize=3, label=f"{mode} Pareto front",
            )  # fmt: skip
        if chosen is not None:
            p = chosen.predicted
            ax.scatter(
                [p.tokens_per_s_user], [p.tokens_per_s_gpu], s=120, marker="*",
                color="red", zorder=5, label=f"chosen: {chosen.label()}",
            )  # fmt: skip
        ax.axvline(1000.0 / q.tpot_ms, color="grey", linestyle="--", label="TPOT target")
        ax.set_xlabel("tokens/s/user")
        ax.set_ylabel("tokens/s/GPU")
        ax.set_title(
            f"{q.model} on {q.gpus} x {q.system} ({q.engine} {answer.engine_version}), "
            f"ISL {q.isl} OSL {q.osl}",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
