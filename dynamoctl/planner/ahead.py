"""What gets the planner ahead of load (docs/planner.md, "Getting ahead of load"), as pure
arithmetic the two loops call:

- :func:`backlog_need`: how many replicas the work queued and in flight needs, so that a
  scale-up is sized in one step instead of one replica per cool-down;
- :func:`lead_time` and :func:`rate_ahead`: the forecast looks one start-up time ahead
  (the start-up the replicas reported), extrapolating the rate's recent trend, so that
  replicas asked for now are ready when the load arrives;
- :func:`down_hold`: how long every signal must stay low before a replica is removed,
  sized to what a wrong removal costs: one start-up of the replica brought back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dynamoctl.planner.perf import (
    PerfModel,
    agg_need,
    decode_need,
    prefill_need,
    replicas_for,
)
from dynamoctl.planner.records import Forecast, PoolMetrics
from dynamoctl.planner.settings import PlannerSettings
from dynamoctl.settings.component import Role

DEFAULT_CONTEXT = 1024.0
"""Context length (tokens) a decode batch is costed at when the pool's KV usage says
nothing (no capacity in the profile, nothing in flight)."""


def backlog_need(
    role: Role,
    metrics: PoolMetrics,
    model: PerfModel,
    settings: PlannerSettings,
    startup_s: float | None = None,
) -> tuple[int, str]:
    """Replicas that carry the pool's load and backlog within the targets, and the
    arithmetic. With the window's arrival rate and lengths: what that rate needs (the
    throughput loop's sizing, :mod:`~dynamoctl.planner.perf`) plus the queued prefill work
    drained within one start-up (replicas asked now help no sooner), plus, while the ready
    replicas carry less than that rate, the backlog they will pile up over one start-up,
    drained within the next. Without them: the
    queued prefill work drained within one TTFT target, plus the requests in flight at
    the largest batch whose ITL meets the target at their mean context."""
    if metrics.arrival_rate is not None and metrics.mean_isl > 0:
        return _rate_need(role, metrics, model, settings, startup_s)
    prefill = decode = 0.0
    notes = []
    if role in ("prefill", "agg") and metrics.queued_prefill_tokens:
        per_replica = model.prefill_tokens_per_second() * settings.ttft_target
        prefill = metrics.queued_prefill_tokens / per_replica
        notes.append(f"{metrics.queued_prefill_tokens} queued tokens = {prefill:.2f} replicas")
    if role in ("decode", "agg") and metrics.inflight:
        capacity = model.profile.kv_capacity_tokens
        held = metrics.kv_usage * capacity * metrics.ready if capacity else 0.0
        context = held / metrics.inflight if held > 0 else DEFAULT_CONTEXT
        batch, _ = model.batch_within(settings.itl_target, context)
        decode = metrics.inflight / max(batch, 1)
        notes.append(f"{metrics.inflight} in flight / batch {max(batch, 1)} = {decode:.2f}")
    needed = replicas_for(prefill + decode)
    return needed, "backlog: " + (" + ".join(notes) or "none") + f" -> {needed}"


def _rate_need(
    role: Role,
    metrics: PoolMetrics,
    model: PerfModel,
    settings: PlannerSettings,
    startup_s: float | None,
) -> tuple[int, str]:
    rate = metrics.arrival_rate or 0.0
    now = Forecast(rate=rate, isl=metrics.mean_isl, osl=max(metrics.mean_osl, 1.0))
    if role == "prefill":
        steady = prefill_need(model, now, settings.ttft_target)
    elif role == "decode":
        steady = decode_need(model, now, settings.itl_target)
    else:
        steady = agg_need(model, now, settings.ttft_target, settings.itl_target)
    queue = 0.0
    horizon = max(settings.ttft_target, startup_s or 0.0)
    if role != "decode":
        queue = metrics.queued_prefill_tokens / (model.prefill_tokens_per_second() * horizon)
    # Until the replicas asked now are ready, the ready ones fall behind by what they lack;
    # that backlog is drained within the start-up after (a step is sized at once to it),
    # and no sooner than a TTFT target (a spare's promotion is shorter than one).
    lack = max(0.0, steady.share - metrics.ready)
    deficit = lack * (startup_s or 0.0) / horizon
    needed = max(steady.replicas, replicas_for(steady.share + queue + deficit))
    arithmetic = f"{rate:.2f} req/s needs {steady.share:.2f}"
    if queue:
        arithmetic += f" + queue {queue:.2f} (drained within a start-up)"
    if deficit:
        arithmetic += f" + {deficit:.2f} for the backlog of {metrics.ready} ready until a start-up"
    return needed, f"load: {arithmetic} -> {needed}"


def lead_time(settings: PlannerSettings, startup_s: float | None) -> float:
    """How far ahead the throughput loop forecasts: one start-up (as the replicas reported
    it, else the cool-down, the settings' guess of it), and never less than the next
    interval."""
    startup = settings.cooldown if startup_s is None else startup_s
    return max(settings.throughput_interval, startup * settings.forecast_startups)


def rate_trend(rates: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (requests/s per second) of ``(time, rate)`` samples; 0 with
    fewer than two."""
    if len(rates) < 2:
        return 0.0
    times = np.array([t for t, _ in rates], dtype=float)
    values = np.array([r for _, r in rates], dtype=float)
    if float(np.ptp(times)) == 0.0:
        return 0.0
    slope = float(np.polyfit(times, values, 1)[0])
    return slope if math.isfinite(slope) else 0.0


SHIFT_RATIO = 0.1
"""A series is a level shift, not a ramp, when two flat levels leave at most this share of
the squared error a straight line leaves."""


def level_shift(rates: Sequence[tuple[float, float]]) -> float | None:
    """The new level when ``(time, rate)`` samples are a step rather than a ramp: the
    series split into two flat runs (at the best break) fits better than a line by
    :data:`SHIFT_RATIO`, and the later run is at least one sample long. ``None``: no step
    (fewer than three samples, flat, or a ramp). A step read as a ramp is extrapolated
    one start-up ahead to a rate that never comes (docs/planner.md, "Measured")."""
    if len(rates) < 3:
        return None
    values = np.array([r for _, r in rates], dtype=float)
    times = np.array([t for t, _ in rates], dtype=float)
    if float(np.ptp(values)) == 0.0 or float(np.ptp(times)) == 0.0:
        return None
    line = np.polyval(np.polyfit(times, values, 1), times)
    line_error = float(((values - line) ** 2).sum())
    best, level = math.inf, 0.0
    for cut in range(1, len(values)):
        before, after = values[:cut], values[cut:]
        error = float(((before - before.mean()) ** 2).sum() + ((after - after.mean()) ** 2).sum())
        if error < best:
            best, level = error, float(after.mean())
    return level if best <= SHIFT_RATIO * line_error else None


def rate_ahead(forecast: Forecast, lead: float) -> Forecast:
    """``forecast`` with its rate carried ``lead`` seconds along its trend when rising; a
    falling trend is not followed (scaling down early buys little, too late costs a
    start-up)."""
    if forecast.trend <= 0.0 or lead <= 0.0:
        return forecast
    rate = forecast.rate + forecast.trend * lead
    return Forecast(rate=rate, isl=forecast.isl, osl=forecast.osl, trend=forecast.trend)


def down_hold(settings: PlannerSettings, startup_s: float | None) -> int:
    """Load intervals in a row with every signal low before a scale-down: at least
    ``stable_intervals``, and ``scale_down_hold`` start-ups' worth of them (a dip shorter
    than a start-up is held through: removing then re-adding a replica costs a start-up
    of missed targets)."""
    startup = 0.0 if startup_s is None else startup_s
    hold = math.ceil(settings.scale_down_hold * startup / settings.load_interval - 1e-9)
    return max(settings.stable_intervals, hold)
