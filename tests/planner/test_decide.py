"""The two loops: a load step adds replicas, a drop removes them, the budget is never
exceeded, stale or missing metrics hold, noise does not flap."""

from __future__ import annotations

import itertools

import msgspec
import numpy as np
import pytest

from dynamoctl.planner.ahead import down_hold, lead_time, level_shift, rate_trend
from dynamoctl.planner.budget import BudgetError, check_budget, fit_to_budget, units
from dynamoctl.planner.decide import decide_load, decide_throughput
from dynamoctl.planner.records import (
    Forecast,
    PlannerState,
    PoolMetrics,
    PoolState,
    TrafficSample,
)
from dynamoctl.planner.settings import PlannerSettings
from tests.planner.helpers import metrics, model, spec, state

pytestmark = pytest.mark.planner

DISAGG = [spec("prefill"), spec("decode")]
SETTINGS = PlannerSettings(itl_target_ms=15.0, gpu_budget=16)
SAMPLE = TrafficSample(at=0.0, interval=60, requests=600, mean_isl=900, mean_osl=200)


def throughput(
    current: PlannerState, rate: float, settings: PlannerSettings = SETTINGS, now: float = 0.0
) -> tuple[dict[str, int], PlannerState, str]:
    decision, after = decide_throughput(
        settings=settings, specs=DISAGG, state=current, model=model(),
        forecast=Forecast(rate=rate, isl=900, osl=200), observed=SAMPLE, now=now,
    )  # fmt: skip
    assert decision.gpus <= settings.gpu_budget
    return {pool.role: pool.desired for pool in decision.pools}, after, decision.reason


def test_a_load_step_raises_each_pool_to_its_floor() -> None:
    desired, after, reason = throughput(state(prefill=1, decode=1), rate=10)
    # prefill: 10 x 0.09 s / (0.82/0.91) = 0.999 -> 1; decode: 2000 / 400 tok/s -> 5.
    assert desired == {"prefill": 1, "decode": 5}
    assert after.pools["decode"].floor == 5 and after.pools["decode"].changed_at == 0.0
    assert "-> 5" in reason


def test_above_the_floor_the_throughput_loop_leaves_the_pool_to_the_load_loop() -> None:
    desired, after, _ = throughput(state(prefill=3, decode=7), rate=10)
    assert desired == {"prefill": 3, "decode": 7}
    assert (after.pools["prefill"].floor, after.pools["decode"].floor) == (1, 5)
    alone = SETTINGS.model_copy(update={"mode": "throughput"})
    assert throughput(state(prefill=3, decode=7), 10, alone)[0] == {"prefill": 1, "decode": 5}


def test_targets_beyond_the_budget_scale_to_the_budget_and_say_so() -> None:
    tight = SETTINGS.model_copy(update={"gpu_budget": 6})
    decision, _ = decide_throughput(
        settings=tight, specs=DISAGG, state=state(prefill=1, decode=1), model=model(),
        forecast=Forecast(rate=40, isl=900, osl=200), observed=SAMPLE, now=0.0,
    )  # fmt: skip
    assert decision.gpus == 6 and decision.budget_bound
    wanted = {pool.role: pool.needed for pool in decision.pools}
    assert wanted == {"prefill": 4, "decode": 20}
    # The 6 GPUs shared in proportion to the needs (4 : 8 after the cap).
    assert {pool.role: pool.desired for pool in decision.pools} == {"prefill": 2, "decode": 4}
    assert (
        "budget-bound" in decision.reason and "capped at decode_max_replicas 8" in decision.reason
    )


def test_missing_profile_forecast_or_fresh_sample_holds() -> None:
    current = state(prefill=2, decode=4)
    for model_, forecast, observed, now in [
        (None, Forecast(rate=1, isl=900, osl=200), SAMPLE, 0.0),
        (model(), None, SAMPLE, 0.0),
        (model(), Forecast(rate=0, isl=900, osl=200), SAMPLE, 1000.0),  # sample too old
    ]:
        decision, after = decide_throughput(
            settings=SETTINGS, specs=DISAGG, state=current, model=model_,
            forecast=forecast, observed=observed, now=now,
        )  # fmt: skip
        assert after == current and decision.changes == {}
        assert all(pool.reason.startswith("hold") for pool in decision.pools)


def run_load(
    current: PlannerState, readings: list[dict[str, float]], start: float = 100.0
) -> tuple[list[int], PlannerState, list[str]]:
    """Decode targets after each load interval with the given KV usage and ITL."""
    targets, reasons = [], []
    for step, reading in enumerate(readings):
        now = start + SETTINGS.load_interval * step
        ready = current.pools["decode"].target
        load = {
            "decode": metrics(now, ready, kv=reading["kv"], itl=reading.get("itl")),
            "prefill": metrics(now, current.pools["prefill"].target),
        }
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
        assert decision.gpus <= SETTINGS.gpu_budget
        targets.append(current.pools["decode"].target)
        reasons.append(decision.pools[1].reason)
    return targets, current, reasons


def test_load_adds_one_replica_after_stable_intervals_then_cools_down() -> None:
    hot = [{"kv": 0.95, "itl": 0.012}] * 10
    targets, _, reasons = run_load(state(prefill=1, decode=2), hot)
    # Up at the 2nd interval; the cool-down (30 s, 6 intervals) ends at the 8th.
    assert targets == [2, 3, 3, 3, 3, 3, 3, 4, 4, 4]
    assert reasons[0] == "KV usage 95% >= 90% (1/2)"
    assert reasons[3] == "KV usage 95% >= 90%; cool-down, 20 s left"


def test_load_drop_removes_replicas_one_at_a_time_down_to_the_floor() -> None:
    current = PlannerState(
        pools={"prefill": PoolState(target=1), "decode": PoolState(target=6, floor=3)}
    )
    idle = [{"kv": 0.1}] * 30
    targets, _, reasons = run_load(current, idle)
    assert targets[:3] == [6, 5, 5] and targets[-1] == 3
    assert all(after - before in (0, -1) for before, after in itertools.pairwise(targets))
    assert reasons[-1] == "every signal low; at its floor 3"


def test_no_flapping_under_noisy_load() -> None:
    rng = np.random.default_rng(7)
    # KV usage alternating across the up threshold, then noise inside the hold band.
    alternating = [{"kv": 0.95 if i % 2 else 0.85, "itl": 0.013} for i in range(40)]
    in_band = [{"kv": float(rng.uniform(0.5, 0.89)), "itl": 0.013} for _ in range(40)]
    targets, _, _ = run_load(state(prefill=1, decode=4), alternating + in_band)
    assert set(targets) == {4}


def test_stale_or_missing_metrics_hold_every_pool() -> None:
    current = state(prefill=3, decode=3)
    for load in ({}, {"decode": metrics(0.0, 3, kv=0.0), "prefill": metrics(0.0, 3)}):
        decision, after = current, current
        for step in range(5):
            now = 100.0 + 5 * step
            outcome, after = decide_load(
                settings=SETTINGS, specs=DISAGG, state=after, model=model(), load=load, now=now
            )
            assert outcome.changes == {}
        assert "hold" in outcome.reason and after.pools["decode"].target == 3
        assert decision is current


def test_no_replica_is_added_while_the_last_one_is_not_ready() -> None:
    current = state(prefill=1, decode=3)
    decision = None
    for step in range(12):
        now = 100.0 + 5 * step
        load = {"decode": metrics(now, 2, kv=0.99), "prefill": metrics(now, 1)}
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
    assert decision is not None and current.pools["decode"].target == 3
    assert "1 of 3 replicas not ready yet" in decision.reason


def test_prefill_scales_on_its_queue_and_ttft() -> None:
    current = state(prefill=1, decode=1)
    for step in range(2):  # 6000 queued tokens at 10k tok/s = 0.6 s > TTFT 0.5 s
        now = 100.0 + 5 * step
        load = {"prefill": metrics(now, 1, queued=6000), "decode": metrics(now, 1, kv=0.6)}
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
    assert decision.changes == {"prefill": 2}
    assert decision.pools[0].reason == "prefill queue 1.20 x TTFT target per replica >= 1.0"


def test_the_load_loop_never_spends_more_than_the_budget() -> None:
    tight = SETTINGS.model_copy(update={"gpu_budget": 5, "cooldown": 0.0, "stable_intervals": 1})
    current = state(prefill=1, decode=1)
    for step in range(20):
        now = 100.0 + 5 * step
        load = {
            "prefill": metrics(now, current.pools["prefill"].target, ttft=2.0),
            "decode": metrics(now, current.pools["decode"].target, kv=1.0),
        }
        decision, current = decide_load(
            settings=tight, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
        assert decision.gpus <= 5
    assert decision.budget_bound and "budget-bound" in decision.reason
    assert sum(pool.target for pool in current.pools.values()) == 5


def test_budget_fit_shares_by_shortfall_and_respects_minimums() -> None:
    specs = [spec("prefill", gpus=2), spec("decode", gpus=1)]
    assert fit_to_budget(specs, {"prefill": 2, "decode": 2}, {"prefill": 1, "decode": 1}, 8) == (
        {"prefill": 2, "decode": 2},
        set(),
    )
    given, short = fit_to_budget(
        specs, {"prefill": 4, "decode": 8}, {"prefill": 1, "decode": 1}, 10
    )
    assert units(specs, given) <= 10 and short == {"prefill", "decode"}
    assert given == {"prefill": 3, "decode": 4}
    with pytest.raises(BudgetError, match="prefill_min_replicas 3 x 2"):
        check_budget([spec("prefill", low=3, gpus=2), spec("decode")], 6)


def test_random_sequences_never_exceed_the_budget() -> None:
    rng = np.random.default_rng(11)
    settings = SETTINGS.model_copy(update={"gpu_budget": 9, "cooldown": 5.0})
    current = state(prefill=1, decode=1)
    for step in range(200):
        now = 100.0 + 5 * step
        if step % 10 == 0:
            rate = float(rng.uniform(0, 60))
            _, current, _ = throughput(current, rate, settings, now=now)
        load = {
            role: metrics(
                now,
                pool.target,
                kv=float(rng.uniform()),
                queued=int(rng.integers(0, 9000)),
                ttft=float(rng.uniform(0, 1)),
                itl=float(rng.uniform(0, 0.03)),
            )
            for role, pool in current.pools.items()
        }
        decision, current = decide_load(
            settings=settings, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
        assert (
            decision.gpus <= 9
            and units(DISAGG, {r: p.target for r, p in current.pools.items()}) <= 9
        )


# -- getting ahead of load (planner/ahead.py) ---------------------------------------------


def test_a_backlog_is_met_in_one_step_not_one_replica_per_cool_down() -> None:
    # 30 requests in flight; at context 1000 a batch of 5 keeps ITL at 15 ms: 6 replicas,
    # on the first interval that shows it (a sized step waits for no second one).
    current = state(prefill=1, decode=1)
    for step in range(1):
        now = 100.0 + 5 * step
        load = {
            "decode": PoolMetrics(at=now, ready=1, kv_usage=0.61, inflight=30, itl=0.05),
            "prefill": metrics(now, 1),
        }
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
    assert decision.changes == {"decode": 6}
    assert "30 in flight / batch 5" in decision.pools[1].reason
    # Still starting (1 of 8 ready) and in cool-down: more backlog still gets its replicas.
    for step in range(2, 4):
        now = 100.0 + 5 * step
        load["decode"] = PoolMetrics(at=now, ready=1, kv_usage=0.61, inflight=40, itl=0.05)
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
    assert current.pools["decode"].target == 8
    # The same backlog once asked for adds nothing while its replicas start.
    for now in (120.0, 125.0):
        load["decode"] = PoolMetrics(at=now, ready=1, kv_usage=0.61, inflight=35, itl=0.05)
        decision, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
    assert current.pools["decode"].target == 8 and "cool-down" in decision.pools[1].reason


def test_a_sized_step_stays_within_max_replicas_and_the_budget() -> None:
    tight = SETTINGS.model_copy(update={"gpu_budget": 6, "stable_intervals": 1})
    load = {
        "decode": PoolMetrics(at=100.0, ready=1, kv_usage=0.61, inflight=40, itl=0.05),
        "prefill": metrics(100.0, 1),
    }
    decision, after = decide_load(
        settings=tight, specs=DISAGG, state=state(prefill=1, decode=1), model=model(),
        load=load, now=100.0,
    )  # fmt: skip
    assert after.pools["decode"].target == 5 and decision.budget_bound and decision.gpus == 6


def run_dip(startup: float | None, low_intervals: int) -> list[int]:
    """Decode targets over ``low_intervals`` of idle, then load again."""
    current = state(prefill=1, decode=4)
    targets = []
    for step in range(low_intervals + 3):
        now = 100.0 + 5 * step
        kv = 0.1 if step < low_intervals else 0.7
        load = {
            "decode": PoolMetrics(at=now, ready=4, kv_usage=kv, startup_s=startup),
            "prefill": metrics(now, 1),
        }
        _, current = decide_load(
            settings=SETTINGS, specs=DISAGG, state=current, model=model(), load=load, now=now
        )
        targets.append(current.pools["decode"].target)
    return targets


def test_a_dip_shorter_than_a_start_up_is_held_through() -> None:
    # Replicas that take 60 s to start: 12 low intervals of 5 s before one is removed.
    assert set(run_dip(startup=60.0, low_intervals=11)) == {4}
    assert run_dip(startup=60.0, low_intervals=12)[11] == 3
    # Without a reported start-up, stable_intervals (2) as before.
    assert run_dip(startup=None, low_intervals=11)[1] == 3


def test_the_forecast_looks_one_start_up_ahead_along_a_rising_trend() -> None:
    settings = SETTINGS.model_copy(update={"throughput_interval": 30.0})
    starting = PlannerState(
        pools={
            "prefill": PoolState(target=1, startup_s=60.0),
            "decode": PoolState(target=1, startup_s=60.0),
        }
    )

    def floors(forecast: Forecast) -> tuple[int, str]:
        decision, _ = decide_throughput(
            settings=settings, specs=DISAGG, state=starting, model=model(),
            forecast=forecast, observed=SAMPLE, now=0.0,
        )  # fmt: skip
        return decision.pools[1].floor, decision.reason

    flat, _ = floors(Forecast(rate=10, isl=900, osl=200))
    rising, reason = floors(Forecast(rate=10, isl=900, osl=200, trend=0.1))
    # 10 req/s now, +0.1/s over the 60 s start-up: sized for 16 req/s (2000 -> 3200 tok/s).
    assert (flat, rising) == (5, 8) and "16.00 in 60 s" in reason
    falling, _ = floors(Forecast(rate=10, isl=900, osl=200, trend=-0.1))
    assert falling == flat  # a falling trend is not followed down early


def test_lead_and_trend_arithmetic() -> None:
    settings = PlannerSettings(throughput_interval=30.0, cooldown=20.0)
    assert lead_time(settings, None) == 30.0  # never under one interval
    assert lead_time(settings, 90.0) == 90.0
    assert rate_trend([(0.0, 1.0), (10.0, 2.0), (20.0, 3.0)]) == pytest.approx(0.1)
    assert rate_trend([(0.0, 1.0)]) == 0.0
    assert down_hold(settings, 47.0) == 10 and down_hold(settings, None) == 2


def test_with_the_window_s_rate_a_step_is_sized_for_that_rate_plus_the_queue() -> None:
    # 30 req/s of 1000-token prompts: 3.0 replicas busy / 0.947 (M/D/1 at 0.1 s of a 0.5 s
    # target) plus decode: 3.43 replicas' worth; 100k queued tokens at 10k tok/s are 10 s
    # of work, over a 60 s start-up 0.17 of a replica; the one ready replica falls 2.43
    # behind until the others start, drained within the start-up after: 6.03 -> 7 (the
    # queue alone, within a TTFT: 20).
    current = PlannerState(pools={"agg": PoolState(target=1, startup_s=60.0)})
    agg = [spec("agg")]
    settings = SETTINGS.model_copy(update={"stable_intervals": 1, "itl_target_ms": 50.0})
    load = {
        "agg": PoolMetrics(
            at=100.0, ready=1, queued_prefill_tokens=100_000, ttft=3.0,
            arrival_rate=30.0, mean_isl=1000.0, mean_osl=1.0,
        )
    }  # fmt: skip
    decision, after = decide_load(
        settings=settings, specs=agg, state=current, model=model(), load=load, now=100.0
    )
    assert after.pools["agg"].target == 7
    assert "30.00 req/s needs 3.43 + queue 0.17" in decision.reason
    assert "+ 2.43 for the backlog of 1 ready" in decision.reason
    # Two ready fall 1.43 behind: 3.43 + 0.17 + 1.43 = 5.03 -> 6.
    ready = {"agg": msgspec.structs.replace(load["agg"], ready=2)}
    current = PlannerState(pools={"agg": PoolState(target=2, startup_s=60.0)})
    _, after = decide_load(
        settings=settings, specs=agg, state=current, model=model(), load=ready, now=100.0
    )
    assert after.pools["agg"].target == 6


def test_a_scale_down_goes_to_the_highest_need_over_a_start_up_in_one_step() -> None:
    # 60 s start-up, 5 s intervals: 12 intervals. 10 req/s needs 2 (1.14 replicas' worth);
    # one interval at 20 req/s (3) in the window keeps 3; once it leaves the window, 2.
    settings = SETTINGS.model_copy(update={"stable_intervals": 1, "cooldown": 0.0})
    agg = [spec("agg")]
    state = PlannerState(pools={"agg": PoolState(target=6, startup_s=60.0)})
    rates = [20.0] + [10.0] * 13
    targets = []
    for i, rate in enumerate(rates):
        load = {
            "agg": PoolMetrics(
                at=5.0 * i, ready=6, ttft=0.1, itl=0.01, arrival_rate=rate,
                mean_isl=1000.0, mean_osl=1.0,
            )
        }  # fmt: skip
        decision, state = decide_load(
            settings=settings, specs=agg, state=state, model=model(), load=load, now=5.0 * i
        )
        targets.append(state.pools["agg"].target)
    assert targets[:11] == [6] * 11, decision.reason  # not a start-up's worth seen yet
    assert targets[11:] == [3, 2, 2]
    # A latency near its target holds whatever the rate says.
    near = {"agg": msgspec.structs.replace(load["agg"], at=65.0, ttft=0.45)}
    state = msgspec.structs.replace(state, pools={"agg": msgspec.structs.replace(
        state.pools["agg"], target=4)})  # fmt: skip
    decision, after = decide_load(
        settings=settings, specs=agg, state=state, model=model(), load=near, now=65.0
    )
    assert after.pools["agg"].target == 4 and "TTFT 450 ms within 80%" in decision.reason


def test_a_step_in_the_rate_is_read_as_a_step_a_ramp_as_a_ramp() -> None:
    step = [(0.0, 2.0), (15.0, 2.1), (30.0, 1.9), (45.0, 11.0)]
    assert level_shift(step) == pytest.approx(11.0)
    assert level_shift([(0.0, 2.0), (15.0, 5.0), (30.0, 8.0), (45.0, 11.0)]) is None
    assert level_shift([(0.0, 2.0), (15.0, 2.0), (30.0, 2.0)]) is None
    assert level_shift(step[-2:]) is None  # two samples: a line through them fits


def test_a_step_the_warm_spares_cover_is_sized_to_a_promotion_not_a_cold_start() -> None:
    # The window test's load without a queue: 3.43 replicas' worth with 1 ready. A cold
    # start (60 s) lets the ready one fall 2.43 behind for a start-up: 5.86 -> 6. Three
    # spares promote in 0.1 s: that backlog is 0.1 s of it, drained within the 0.5 s TTFT
    # target: 3.43 + 0.49 = 3.92 -> 4, which the spares cover. One spare covers 1 of the
    # 3 new: the step waits on cold starts and is sized to them.
    current = PlannerState(pools={"agg": PoolState(target=1, startup_s=60.0)})
    agg = [spec("agg")]
    settings = SETTINGS.model_copy(update={"stable_intervals": 1, "itl_target_ms": 50.0})
    cold = PoolMetrics(
        at=100.0, ready=1, ttft=3.0, arrival_rate=30.0, mean_isl=1000.0, mean_osl=1.0
    )

    def target(load: PoolMetrics) -> tuple[int, str]:
        decision, after = decide_load(
            settings=settings, specs=agg, state=current, model=model(), load={"agg": load},
            now=100.0,
        )  # fmt: skip
        return after.pools["agg"].target, decision.reason

    assert target(cold)[0] == 6
    covered, reason = target(msgspec.structs.replace(cold, spares=3, promotion_s=0.1))
    assert covered == 4
    assert "+ 0.49 for the backlog of 1 ready" in reason
    assert "spares cover it: promotion 0.1 s" in reason
    assert target(msgspec.structs.replace(cold, spares=1, promotion_s=0.1))[0] == 6
