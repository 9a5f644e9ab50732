"""From request records to the numbers a run is judged by (definitions in docs/benchmarks.md).

- TTFT: request start (before connecting) to the first chunk carrying text.
- ITL: time between consecutive text chunks, pooled over every request.
- TPOT: per request, (last text chunk - first) / (output tokens - 1): its mean ITL.
- E2E: request start to the end of the stream (``[DONE]``).
- Goodput: successful requests per second whose TTFT and TPOT meet the targets given.
- Prefix hit rate: cached prompt tokens / prompt tokens, over requests whose usage said.
"""

from __future__ import annotations

import math
from collections import Counter

import msgspec

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.schedule import RunOutcome


class Dist(msgspec.Struct):
    """A latency distribution in milliseconds (all zero when there is no sample)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float


class Slo(msgspec.Struct, frozen=True):
    ttft_ms: float | None = None
    itl_ms: float | None = None
    """Compared with each request's TPOT (its mean ITL), as vLLM's goodput does."""


class Summary(msgspec.Struct, kw_only=True):
    label: str
    concurrency: int | None = None
    rate: float | None = None
    requests_sent: int
    completed: int
    errors: dict[str, int]
    duration_s: float
    request_throughput: float
    """Completed requests per second."""
    output_token_throughput: float
    input_token_throughput: float
    goodput: float | None
    """Completed requests per second that met every target; None without targets."""
    goodput_fraction: float | None
    slo: Slo
    ttft_ms: Dist
    itl_ms: Dist
    tpot_ms: Dist
    e2e_ms: Dist
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefix_hit_rate: float | None
    """None when no response reported ``cached_tokens``."""
    max_arrival_lag_ms: float = 0.0


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``ordered`` sorted."""
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def dist_ms(values: list[float]) -> Dist:
    ordered = sorted(v * 1e3 for v in values)
    if not ordered:
        return Dist(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    r = _round
    return Dist(
        count=len(ordered),
        mean=r(sum(ordered) / len(ordered)),
        p50=r(percentile(ordered, 0.5)),
        p90=r(percentile(ordered, 0.9)),
        p99=r(percentile(ordered, 0.99)),
        min=r(ordered[0]),
        max=r(ordered[-1]),
    )


def _round(x: float) -> float:
    return round(x, 3)


def meets(record: RequestRecord, slo: Slo) -> bool:
    if record.error is not None or record.ttft is None:
        return False
    if slo.ttft_ms is not None and record.ttft * 1e3 > slo.ttft_ms:
        return False
    tpot = record.tpot
    return slo.itl_ms is None or tpot is None or tpot * 1e3 <= slo.itl_ms


def summarize(
    outcome: RunOutcome,
    slo: Slo,
    *,
    label: str,
    concurrency: int | None = None,
    rate: float | None = None,
) -> Summary:
    ok = [r for r in outcome.records if r.error is None]
    errors = Counter(r.error for r in outcome.records if r.error is not None)
    if outcome.unfinished:
        errors["unfinished"] = outcome.unfinished
    duration = max(outcome.duration, 1e-9)
    with_usage = [r for r in ok if r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in with_usage)
    reported = [r for r in with_usage if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in reported)
    reported_prompt = sum(r.prompt_tokens or 0 for r in reported)
    input_tokens = sum(r.prompt_tokens or r.sent_prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    has_slo = slo.ttft_ms is not None or slo.itl_ms is not None
    good = sum(meets(r, slo) for r in ok) if has_slo else 0
    return Summary(
        label=label,
        concurrency=concurrency,
        rate=rate,
        requests_sent=outcome.issued,
        completed=len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=_round(duration),
        request_throughput=_round(len(ok) / duration),
        output_token_throughput=_round(output / duration),
        input_token_throughput=_round(input_tokens / duration),
        goodput=_round(good / duration) if has_slo else None,
        goodput_fraction=_round(good / max(1, outcome.issued)) if has_slo else None,
        slo=slo,
        ttft_ms=dist_ms([r.ttft for r in ok if r.ttft is not None]),
        itl_ms=dist_ms([g for r in ok for g in r.gaps]),
        tpot_ms=dist_ms([t for r in ok if (t := r.tpot) is not None]),
        e2e_ms=dist_ms([r.e2e for r in ok if r.e2e is not None]),
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=output,
        prefix_hit_rate=_round(cached / reported_prompt) if reported_prompt else None,
        max_arrival_lag_ms=_round(outcome.max_lag * 1e3),
    )
