"""The planner's two loops as pure functions: state and observations in, a
:class:`~dynamoctl.planner.records.Decision` and the next state out (docs/planner.md).

- :func:`decide_throughput` (minutes): forecast → replicas each pool needs from the
  performance model → bounds → GPU budget. That is each pool's *floor*; a pool under its
  floor is raised to it at once. Above the floor it is left to the load loop (mode
  ``both``), or set to the floor exactly (mode ``throughput``).
  The forecast is carried one start-up time ahead along the rate's trend
  (:mod:`~dynamoctl.planner.ahead`), so replicas are ready when the load arrives.
- :func:`decide_load` (seconds): up from live signals (queued prefill work, KV usage,
  TTFT/ITL against target) to what the backlog needs, in one step (one more when the
  backlog says no more); down by one, never under the floor, never over
  ``max_replicas`` or the budget. A signal must hold for ``stable_intervals`` in a row
  (a scale-down: also ``scale_down_hold`` start-up times, so a short dip is held
  through); a pool that just changed is left alone for ``cooldown`` and one whose new
  replicas are not ready yet gets no more, unless its backlog needs more than it asked;
  missing or stale metrics hold the pool (never a scale-down on missing data).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from dynamoctl.planner import budget as budgets
from dynamoctl.planner.ahead import backlog_need, down_hold, lead_time, rate_ahead
from dynamoctl.planner.perf import (
    PerfModel,
    PoolNeed,
    agg_need,
    corrections,
    decode_need,
    prefill_need,
)
from dynamoctl.planner.records import (
    Action,
    Decision,
    Forecast,
    Loop,
    PlannerState,
    PoolDecision,
    PoolMetrics,
    PoolSpec,
    PoolState,
    TrafficSample,
)
from dynamoctl.planner.settings import PlannerSettings
from dynamoctl.settings.component import Role
from dynamoctl.wire.roles import DECODE_ROLES, PREFILL_ROLES


def _action(current: int, desired: int) -> Action:
    return "up" if desired > current else "down" if desired < current else "hold"


def _moved(pool: PoolState, desired: int, now: float) -> PoolState:
    """``pool`` after its target became ``desired`` (streaks start again on a change)."""
    if desired == pool.target:
        return pool
    return msgspec.structs.replace(pool, target=desired, changed_at=now, up_streak=0, down_streak=0)


def _need(
    role: Role,
    settings: PlannerSettings,
    model: PerfModel,
    forecast: Forecast,
    observed: TrafficSample | None,
) -> PoolNeed:
    factors = corrections(model, observed)
    if role == "prefill":
        return prefill_need(model, forecast, settings.ttft_target, factors[0])
    if role == "decode":
        return decode_need(model, forecast, settings.itl_target, factors[1])
    return agg_need(model, forecast, settings.ttft_target, settings.itl_target, factors)


def _hold_all(
    loop: Loop, specs: Sequence[PoolSpec], state: PlannerState, now: float, reason: str, budget: int
) -> Decision:
    pools = tuple(
        PoolDecision(
            role=spec.role,
            current=state.pools[spec.role].target,
            desired=state.pools[spec.role].target,
            floor=state.pools[spec.role].floor,
            action="hold",
            reason=reason,
        )
        for spec in specs
    )
    targets = {role: pool.target for role, pool in state.pools.items()}
    return Decision(
        loop=loop,
        at=now,
        pools=pools,
        gpus=budgets.units(specs, targets),
        budget=budget,
    )


def decide_throughput(
    *,
    settings: PlannerSettings,
    specs: Sequence[PoolSpec],
    state: PlannerState,
    model: PerfModel | None,
    forecast: Forecast | None,
    observed: TrafficSample | None,
    now: float,
) -> tuple[Decision, PlannerState]:
    """One throughput-loop decision: each pool's floor from ``forecast`` and ``model``
    (corrected by the ``observed`` interval's latencies), within bounds and the budget."""
    budget = settings.gpu_budget
    if model is None or forecast is None:
        missing = "no performance profile" if model is None else "no forecast yet"
        return _hold_all("throughput", specs, state, now, f"hold: {missing}", budget), state
    if observed is None or now - observed.at > settings.throughput_interval + settings.stale_after:
        reason = "hold: no traffic sample from the last interval (metrics missing or stale)"
        return _hold_all("throughput", specs, state, now, reason, budget), state
    startup = max(filter(None, (pool.startup_s for pool in state.pools.values())), default=None)
    lead = lead_time(settings, startup)
    ahead = rate_ahead(forecast, lead)  # replicas asked now are ready a start-up from now
    needs = {spec.role: _need(spec.role, settings, model, ahead, observed) for spec in specs}
    bounded = {
        spec.role: min(max(needs[spec.role].replicas, spec.min_replicas), spec.max_replicas)
        for spec in specs
    }
    least = {spec.role: spec.min_replicas for spec in specs}
    floors, short = budgets.fit_to_budget(specs, bounded, least, budget)
    if settings.mode == "throughput":
        wanted = floors
    else:  # the load loop owns the room above the floor: only a pool under it moves
        wanted = {role: max(state.pools[role].target, floor) for role, floor in floors.items()}
    targets, squeezed = budgets.fit_to_budget(specs, wanted, floors, budget)
    decisions, pools = [], dict(state.pools)
    for spec in specs:
        role, need, pool = spec.role, needs[spec.role], state.pools[spec.role]
        notes = [need.reason]
        if ahead is not forecast:
            notes.insert(0, f"{forecast.rate:.2f} req/s rising: {ahead.rate:.2f} in {lead:.0f} s")
        if not need.meets_target:
            notes.append("target unreachable at any size")
        if need.replicas > spec.max_replicas:
            notes.append(f"capped at {role}_max_replicas {spec.max_replicas}")
        if role in short:
            notes.append(f"budget-bound: {floors[role]} within gpu_budget {budget}")
        elif role in squeezed:
            notes.append(f"budget-bound: brought to {targets[role]} for the other pools' floors")
        decisions.append(
            PoolDecision(
                role=role,
                current=pool.target,
                desired=targets[role],
                floor=floors[role],
                action=_action(pool.target, targets[role]),
                budget_bound=role in short or role in squeezed,
                needed=need.replicas,
                reason="; ".join(notes),
            )
        )
        pools[role] = msgspec.structs.replace(_moved(pool, targets[role], now), floor=floors[role])
    decision = Decision(
        loop="throughput",
        at=now,
        pools=tuple(decisions),
        gpus=budgets.units(specs, targets),
        budget=budget,
        forecast=forecast,
        observed=observed,
        lead_s=lead,
    )
    return decision, PlannerState(pools=pools)


def _latency(
    name: str,
    observed: float | None,
    target: float,
    fraction: float,
    up: list[str],
    keep: list[str],
) -> None:
    if observed is None:  # nothing measured: an idle pool, which blocks no scale-down
        return
    text = f"{name} {observed * 1e3:.0f} ms"
    if observed > target:
        up.append(f"{text} > target {target * 1e3:.0f} ms")
    elif observed >= fraction * target:
        keep.append(f"{text} within {fraction:.0%} of target")


def _signals(
    role: Role, metrics: PoolMetrics, settings: PlannerSettings, model: PerfModel | None
) -> tuple[list[str], list[str]]:
    """(what calls for one more replica, what forbids one fewer) from a pool's metrics."""
    up: list[str] = []
    keep: list[str] = []
    if metrics.frontend_queued:  # every worker busy for them: no replica to spare
        waiting = ", ".join(f"{k} {n}" for k, n in sorted(metrics.frontend_queued.items()))
        keep.append(f"requests queued at the frontends ({waiting})")
    if role in PREFILL_ROLES:
        if model is not None:  # queued tokens in seconds of work, as a share of the target
            per_replica = metrics.queued_prefill_tokens / max(metrics.ready, 1)
            queue = per_replica / model.prefill_tokens_per_second() / settings.ttft_target
            text = f"prefill queue {queue:.2f} x TTFT target per replica"
            if queue >= settings.prefill_queue_up:
                up.append(f"{text} >= {settings.prefill_queue_up}")
            elif queue >= settings.prefill_queue_down:
                keep.append(text)
        fraction = settings.scale_down_fraction
        _latency("TTFT", metrics.ttft, settings.ttft_target, fraction, up, keep)
    if role in DECODE_ROLES:
        text = f"KV usage {metrics.kv_usage:.0%}"
        if metrics.kv_usage >= settings.kv_usage_up:
            up.append(f"{text} >= {settings.kv_usage_up:.0%}")
        elif metrics.kv_usage >= settings.kv_usage_down:
            keep.append(text)
        fraction = settings.scale_down_fraction
        _latency("ITL", metrics.itl, settings.itl_target, fraction, up, keep)
    return up, keep


def _up_to(
    spec: PoolSpec,
    pool: PoolState,
    metrics: PoolMetrics,
    model: PerfModel | None,
    settings: PlannerSettings,
) -> tuple[int, str]:
    """How many replicas a scale-up asks for: what the backlog needs when that is more
    than the target (sized in one step), else one more."""
    if model is None:
        return pool.target + 1, ""
    cold = pool.startup_s or metrics.startup_s
    # a step the warm spares cover is ready after a promotion: it is sized to the backlog
    # one promotion builds; a larger one waits for cold starts and is sized to theirs
    need, why = backlog_need(spec.role, metrics, model, settings, metrics.lead_s(cold))
    if metrics.spares and need - pool.target > metrics.spares:
        need, why = backlog_need(spec.role, metrics, model, settings, cold)
    elif metrics.spares:
        why += f" (spares cover it: promotion {metrics.promotion_s:g} s)"
    return max(pool.target + 1, need), why


def _decide_pool(
    spec: PoolSpec,
    pool: PoolState,
    metrics: PoolMetrics | None,
    *,
    settings: PlannerSettings,
    model: PerfModel | None,
    gpus_elsewhere: int,
    now: float,
) -> tuple[PoolDecision, PoolState]:
    """One pool's load-loop move; ``gpus_elsewhere``: what the other pools' targets hold."""
    floor = max(pool.floor, spec.min_replicas)

    def settle(
        desired: int, reason: str, after: PoolState, bound: bool = False
    ) -> tuple[PoolDecision, PoolState]:
        decision = PoolDecision(
            role=spec.role,
            current=pool.target,
            desired=desired,
            floor=pool.floor,
            action=_action(pool.target, desired),
            budget_bound=bound,
            reason=reason,
        )
        return decision, _moved(after, desired, now)

    quiet = msgspec.structs.replace(pool, up_streak=0, down_streak=0)
    if not spec.min_replicas <= pool.target <= spec.max_replicas:
        bounded = min(max(pool.target, spec.min_replicas), spec.max_replicas)
        return settle(bounded, f"{pool.target} replicas outside [min, max]: {bounded}", quiet)
    if metrics is None:
        return settle(pool.target, "hold: no metrics (never scales down on missing data)", quiet)
    if now - metrics.at > settings.stale_after:
        stale = f"{now - metrics.at:.0f} s old (stale after {settings.stale_after:.0f} s)"
        return settle(pool.target, f"hold: metrics {stale}", quiet)
    up, keep = _signals(spec.role, metrics, settings, model)
    startup = max(filter(None, (pool.startup_s, metrics.startup_s)), default=None)
    wanted, backlog = _up_to(spec, pool, metrics, model, settings) if up else (0, "")
    sized = wanted > pool.target + 1  # the backlog needs more than one: a sized step
    by_rate = model is not None and metrics.arrival_rate is not None and metrics.mean_isl > 0
    needs = pool.needs
    if model is not None and by_rate:
        need = backlog_need(spec.role, metrics, model, settings, startup)[0]
        needs = (*pool.needs, need)[-_need_window(settings, startup) :]
    pool = msgspec.structs.replace(
        pool,
        up_streak=pool.up_streak + 1 if up else 0,
        down_streak=pool.down_streak + 1 if not up and not keep else 0,
        startup_s=startup,
        needs=needs,
    )
    if not up and by_rate:
        return _down_to_need(spec, pool, metrics, settings, floor, now, settle)
    if up:  # a sized step (a level shift the backlog shows) waits for no second interval
        streak, reason = pool.up_streak, ", ".join(up)
        needed = 1 if sized else settings.stable_intervals
        reason += f"; {backlog}" if sized else ""
    elif not keep:
        streak, needed, reason = pool.down_streak, down_hold(settings, startup), "every signal low"
    else:
        return settle(pool.target, "hold: " + ", ".join(keep), pool)
    if streak < needed:
        return settle(pool.target, f"{reason} ({streak}/{needed})", pool)
    if not sized and pool.changed_at is not None and now - pool.changed_at < settings.cooldown:
        left = settings.cooldown - (now - pool.changed_at)
        return settle(pool.target, f"{reason}; cool-down, {left:.0f} s left", pool)
    if up and not sized and metrics.ready < pool.target:
        waiting = f"{pool.target - metrics.ready} of {pool.target} replicas not ready yet"
        return settle(pool.target, f"{reason}; {waiting}", pool)
    if not up:
        if pool.target <= floor:
            return settle(pool.target, f"{reason}; at its floor {floor}", pool)
        return settle(pool.target - 1, reason, pool)
    return _grow(spec, pool, wanted, reason, gpus_elsewhere, settings, settle)


def _need_window(settings: PlannerSettings, startup: float | None) -> int:
    """Load intervals whose needs a scale-down must stay under: a start-up's worth
    (:func:`~dynamoctl.planner.ahead.down_hold`), and never under the cool-down's (a fast
    start is no reason to follow every 5 s window's noise down)."""
    return down_hold(settings, max(startup or 0.0, settings.cooldown))


def _down_to_need(
    spec: PoolSpec,
    pool: PoolState,
    metrics: PoolMetrics,
    settings: PlannerSettings,
    floor: int,
    now: float,
    settle: Callable[[int, str, PoolState], tuple[PoolDecision, PoolState]],
) -> tuple[PoolDecision, PoolState]:
    """The scale-down when the arrival rate is known: to the highest need of the last
    start-up's worth of intervals (what a replica removed now could not be brought back
    in time for), in one step, and only while the latencies are clear of their targets."""
    latency: list[str] = []
    fraction = settings.scale_down_fraction
    if spec.role in PREFILL_ROLES:
        _latency("TTFT", metrics.ttft, settings.ttft_target, fraction, latency, latency)
    if spec.role in DECODE_ROLES:
        _latency("ITL", metrics.itl, settings.itl_target, fraction, latency, latency)
    if latency:
        return settle(pool.target, "hold: " + ", ".join(latency), pool)
    hold, highest = _need_window(settings, pool.startup_s), max(pool.needs, default=pool.target)
    seen = f"highest need {highest} over {len(pool.needs)}/{hold} intervals"
    if len(pool.needs) < hold or highest >= pool.target:
        return settle(pool.target, f"hold: {seen}", pool)
    if pool.target <= floor:
        return settle(pool.target, f"{seen}; at its floor {floor}", pool)
    if pool.changed_at is not None and now - pool.changed_at < settings.cooldown:
        left = settings.cooldown - (now - pool.changed_at)
        return settle(pool.target, f"{seen}; cool-down, {left:.0f} s left", pool)
    return settle(max(highest, floor), f"{seen} (a start-up)", pool)


def _grow(
    spec: PoolSpec,
    pool: PoolState,
    wanted: int,
    reason: str,
    gpus_elsewhere: int,
    settings: PlannerSettings,
    settle: Callable[[int, str, PoolState, bool], tuple[PoolDecision, PoolState]],
) -> tuple[PoolDecision, PoolState]:
    """A scale-up to ``wanted``, within ``max_replicas`` and the GPU budget."""
    if pool.target >= spec.max_replicas:
        return settle(pool.target, f"{reason}; at {spec.role}_max_replicas", pool, False)
    room = (settings.gpu_budget - gpus_elsewhere) // spec.budget_units
    if room <= pool.target:
        budget = f"budget-bound: gpu_budget {settings.gpu_budget} is spent"
        return settle(pool.target, f"{reason}; {budget}", pool, True)
    desired = min(wanted, spec.max_replicas, room)
    bound = desired < wanted and desired == room
    return settle(desired, reason, pool, bound)


def decide_load(
    *,
    settings: PlannerSettings,
    specs: Sequence[PoolSpec],
    state: PlannerState,
    model: PerfModel | None,
    load: Mapping[Role, PoolMetrics],
    now: float,
) -> tuple[Decision, PlannerState]:
    """One load-loop decision: each pool up or down by one, or held (the reason says why)."""
    pools = dict(state.pools)
    targets = {role: pool.target for role, pool in pools.items()}
    decisions = []
    for spec in specs:
        elsewhere = budgets.units([s for s in specs if s.role != spec.role], targets)
        decision, pools[spec.role] = _decide_pool(
            spec,
            pools[spec.role],
            load.get(spec.role),
            settings=settings,
            model=model,
            gpus_elsewhere=elsewhere,
            now=now,
        )
        targets[spec.role] = decision.desired
        decisions.append(decision)
    return Decision(
        loop="load",
        at=now,
        pools=tuple(decisions),
        gpus=budgets.units(specs, targets),
        budget=settings.gpu_budget,
        load=dict(load),
    ), PlannerState(pools=pools)
