"""``dynamoctl configure --verify``: run the chosen configuration on mocker workers that
take their step times from AI Configurator (``perf_model: aic``), under the load the
prediction is for, and set simulated against predicted figures (docs/configure.md,
"Verifying by simulation").

The deployment is real: ``dynamoctl up --detach`` of a local recipe with the same pools
and replica counts (each replica a mocker with the pool's parallelism and batch size, at a
clock speed-up), in a private run-directory home, then ``dynamoctl bench``'s runner at
the configuration's predicted request rate (Poisson arrivals; or, ``--verify-load
concurrency``, a closed loop at its concurrency) over all units, then ``dynamoctl down``.
Figures are read in steady state: TTFT and TPOT of requests sent once the first request
has completed (before, the deployment is filling up), throughput per GPU and requests in
flight over the window from that first completion to the last request sent. Simulated
seconds are real seconds x the speed-up.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import msgspec
from rich.table import Table

from dynamoctl.configure import aic
from dynamoctl.configure.models import Answer, Candidate, ConfigureError, Pool, Question

if TYPE_CHECKING:
    from rich.console import Console

    from dynamoctl.bench.client import RequestRecord
    from dynamoctl.configure.options import ConfigureOptions

BLOCK = 64
"""KV block size of the simulated workers (the recipe's default)."""
REAL_TOKEN_RATE = 1500.0
"""Streamed tokens per real second the default speed-up aims at: past a few thousand the
frontend and the workers' Python fall behind the simulated clock on a small machine, and
late tokens would read as slow steps."""


def auto_speedup(chosen: Candidate, units: int) -> float:
    """The speed-up at which the predicted output rate streams :data:`REAL_TOKEN_RATE`
    tokens per real second (at most 10x)."""
    simulated = chosen.predicted.tokens_per_s_gpu * chosen.gpus_per_unit * units
    return min(10.0, REAL_TOKEN_RATE / max(simulated, 1e-9))


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    ttft_ms: float
    tpot_ms: float
    tokens_per_s_gpu: float
    in_flight: float
    """Requests in flight over the whole deployment (closed loop: the concurrency)."""


class Verification(msgspec.Struct, frozen=True, kw_only=True):
    """Predicted and simulated figures of one configuration under one load."""

    label: str
    gpus: int
    load: str
    """The load sent: ``rate R/s`` (Poisson) or ``concurrency C`` (closed loop)."""
    requests: int
    completed: int
    speedup: float
    predicted: Figures
    simulated: Figures
    recipe: str
    """The mocker recipe that was run (to run it again by hand)."""


def mocker_args(answer: Answer, pool: Pool, speedup: float) -> dict[str, Any]:
    """A mocker replica standing in for one instance of ``pool``."""
    q = answer.question
    p = pool.parallel
    step_tokens = q.isl + pool.batch_size  # AI Configurator's agg step: one prompt + decodes
    capacity = aic.kv_capacity_tokens(
        q.model, q.system, q.engine, answer.engine_version, p,
        max_batch=pool.batch_size, max_step_tokens=step_tokens,
    )  # fmt: skip
    return {
        "perf-model": "aic",
        "aic-model": q.model,
        "aic-system": q.system,
        "aic-engine": q.engine,
        "aic-engine-version": answer.engine_version,
        "aic-tp-size": p.tp,
        "aic-pp-size": p.pp,
        "aic-dp-size": p.dp,
        "aic-moe-tp-size": p.moe_tp,
        "aic-moe-ep-size": p.moe_ep,
        "max-num-seqs": pool.batch_size,
        "max-num-batched-tokens": step_tokens,
        "num-gpu-blocks": capacity // BLOCK,  # the simulated GPU's KV cache
        "kv-bytes-per-token": aic.kv_bytes_per_token(aic.resolve_model(q.model)),
        "speedup-ratio": speedup,
    }


def mocker_recipe(
    answer: Answer, chosen: Candidate, units: int, *, name: str, port: int, speedup: float
) -> dict[str, Any]:
    """The local mocker deployment standing in for ``units`` units of ``chosen``."""
    workers = {
        role: {
            "engine": "mocker",
            "replicas": pool.workers * units,
            "gpus_per_replica": 0,
            "engine_args": mocker_args(answer, pool, speedup),
        }
        for role, pool in chosen.pools().items()
    }
    return {
        "schema": 1,
        "name": name,
        "target": {"kind": "local", "gpus": 0},
        "model": {"name": "verify", "path": "verify", "block_size": BLOCK},
        "frontend": {"port": port, "host": "127.0.0.1"},
        "workers": workers,
        "supervision": {"start_timeout": 300},
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dynamoctl(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def verify(
    answer: Answer, chosen: Candidate, units: int, options: ConfigureOptions, console: Console
) -> Verification:
    """Bring the mocker deployment up, load it, take it down; compare (module docstring)."""
    from ruamel.yaml import YAML

    from dynamoctl.recipe.loader import load_recipe

    speedup = options.verify_speedup or auto_speedup(chosen, units)
    q = answer.question
    port = _free_port()
    recipe = mocker_recipe(answer, chosen, units, name="verify", port=port, speedup=speedup)
    path = options.out.with_suffix(".verify.yaml")
    with open(path, "w") as out:
        YAML(typ="safe").dump(recipe, out)
    load_recipe(path)  # a RecipeError here is ours: fail before starting anything
    concurrency = chosen.concurrency * units
    requests = concurrency * options.verify_rounds
    e2e = (chosen.predicted.ttft_ms + q.osl * chosen.predicted.tpot_ms) / 1e3 / speedup
    with tempfile.TemporaryDirectory(prefix="dynamoctl-verify-") as home:
        env = {**os.environ, "DYNAMOCTL_HOME": home}
        console.print(f"verify: starting {chosen.label()} on mocker workers ({path}) ...")
        up = _dynamoctl(env, "up", "--detach", str(path), timeout=600)
        try:
            if up.returncode != 0:
                raise ConfigureError(f"verify: dynamoctl up failed:\n{up.stderr[-3000:]}")
            rate = chosen.predicted.request_rate * units * speedup  # per real second
            load = (
                f"rate {chosen.predicted.request_rate * units:.3g}/s"
                if options.verify_load == "rate"
                else f"concurrency {concurrency}"
            )
            console.print(f"verify: {requests} requests at {load} (simulated time) ...")
            by_rate = rate if options.verify_load == "rate" else None
            records = asyncio.run(_load(port, q, concurrency, by_rate, requests, e2e))
        finally:
            _dynamoctl(env, "down", "verify", "--now", timeout=180)
    ok = [r for r in records if r.error is None]
    if not ok:
        kinds = sorted({r.error or "" for r in records})
        raise ConfigureError(f"verify: no request completed ({', '.join(kinds)})")
    p = chosen.predicted
    predicted = Figures(
        ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms, tokens_per_s_gpu=p.tokens_per_s_gpu,
        in_flight=concurrency,
    )  # fmt: skip
    return Verification(
        label=chosen.label(), gpus=chosen.gpus_per_unit * units, load=load,
        requests=len(records), completed=len(ok), speedup=speedup,
        predicted=predicted,
        simulated=steady_figures(ok, speedup, chosen.gpus_per_unit * units),
        recipe=str(path),
    )  # fmt: skip


async def _load(
    port: int,
    question: Question,
    concurrency: int,
    rate: float | None,
    requests: int,
    e2e_s: float,
) -> list[RequestRecord]:
    from rich.console import Console

    from dynamoctl.bench.runner import BenchConfig, run_bench
    from dynamoctl.bench.schedule import Limits

    config = BenchConfig(
        target=f"http://127.0.0.1:{port}", concurrency=[] if rate else [concurrency],
        rates=[rate] if rate else [], isl=str(question.isl), osl=str(question.osl),
        timeout=max(60.0, 20 * e2e_s),
        limits=Limits(requests, 3600.0, max(60.0, 10 * e2e_s), 8 * concurrency),
    )  # fmt: skip
    result = await run_bench(config, console=Console(stderr=True, quiet=True))
    return result.runs[0].requests


def steady_figures(records: list[RequestRecord], speedup: float, gpus: int) -> Figures:
    """Simulated-time figures of completed ``records`` in steady state (module docstring)."""
    first_done = min(r.start + (r.e2e or 0.0) for r in records)
    last_sent = max(r.start for r in records)
    later = [r for r in records if r.start >= first_done] or records
    ttft = statistics.fmean(r.ttft or 0.0 for r in later)
    tpots = [t for r in later if (t := r.tpot) is not None]
    tpot = statistics.fmean(tpots) if tpots else 0.0
    lo, hi = (first_done, last_sent) if last_sent > first_done else (0.0, first_done)
    span = max(hi - lo, 1e-9)
    tokens = sum(_tokens_within(r, lo, hi) for r in records)
    busy = sum(max(0.0, min(hi, r.start + (r.e2e or 0.0)) - max(lo, r.start)) for r in records)
    return Figures(
        ttft_ms=ttft * 1e3 * speedup,
        tpot_ms=tpot * 1e3 * speedup,
        tokens_per_s_gpu=tokens / span / speedup / max(gpus, 1),  # per simulated second
        in_flight=busy / span,
    )


def _tokens_within(record: RequestRecord, lo: float, hi: float) -> float:
    """Output tokens ``record`` produced in [lo, hi], spread evenly between its first
    and its last token."""
    first = record.start + (record.ttft or 0.0)
    last = record.start + (record.e2e or 0.0)
    if last <= first:
        return float(record.output_tokens) if lo <= last <= hi else 0.0
    overlap = max(0.0, min(hi, last) - max(lo, first))
    return record.output_tokens * overlap / (last - first)


def comparison_table(result: Verification) -> Table:
    table = Table(
        title=(
            f"--verify: {result.label} ({result.gpus} GPUs) simulated on mocker workers at "
            f"x{result.speedup:.3g}, {result.load}, "
            f"{result.completed}/{result.requests} requests"
        ),
        caption=f"mocker recipe: {result.recipe}",
    )
    for header in ("", "predicted", "simulated", "simulated / predicted"):
        table.add_column(header, justify="right")
    for label, name, digits in (
        ("TTFT ms", "ttft_ms", 0),
        ("TPOT ms", "tpot_ms", 1),
        ("tok/s/GPU", "tokens_per_s_gpu", 1),
        ("requests in flight", "in_flight", 1),
    ):
        pred = getattr(result.predicted, name)
        sim = getattr(result.simulated, name)
        ratio = f"{sim / pred:.2f}" if pred else "-"
        table.add_row(label, f"{pred:.{digits}f}", f"{sim:.{digits}f}", ratio)
    return table
