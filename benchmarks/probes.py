"""What the failure probes share (``chaos.py``, ``worker_kill_probe.py``,
``supervisor_restart.py``): a local mocker deployment to break, and what streaming
clients noticed while it broke."""

from __future__ import annotations

from typing import Any

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.stats import percentile

MODEL = "mock-llama"


def mocker_recipe(name: str, port: int, workers: int, speedup: float, extra: str = "") -> str:
    """A local deployment of ``workers`` mocker replicas behind a KV-routing frontend."""
    return f"""\
schema: 1
name: {name}
model: {{name: {MODEL}, path: {MODEL}, block_size: 16}}
frontend: {{port: {port}, router: {{mode: kv}}}}
workers:
  agg:
    engine: mocker
    replicas: {workers}
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 4096, max-num-seqs: 256, speedup-ratio: {speedup:g}}}
{extra}"""


def latency_ms(values: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``values`` (seconds) in milliseconds."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p99": None, "max": None}
    ms = [percentile(ordered, q) * 1000 for q in (0.5, 0.99)]
    return {"p50": round(ms[0], 1), "p99": round(ms[1], 1), "max": round(ordered[-1] * 1000, 1)}


def stream_summary(records: list[RequestRecord], unfinished: int) -> dict[str, Any]:
    """Requests, failures (unfinished ones included) by kind, the longest silence inside
    each stream, TTFT and output tokens."""
    ok = [r for r in records if r.error is None]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "requests": len(records) + unfinished,
        "failed": len(records) - len(ok) + unfinished,
        "errors_by_kind": errors,
        "error_details": sorted({f"{r.error}: {r.detail}" for r in records if r.error})[:5],
        "stream_gap_ms": latency_ms([max(r.gaps) for r in ok if r.gaps]),
        "ttft_ms": latency_ms([r.ttft for r in ok if r.ttft is not None]),
        "output_tokens": sum(r.output_tokens for r in ok),
    }
