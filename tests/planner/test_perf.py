"""The performance profile and the replica formulas, against values computed by hand
(the profile in helpers.py)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from dynamoctl.planner.perf import (
    PerfModel,
    ProfileError,
    agg_need,
    check_profile,
    correction,
    corrections,
    decode_need,
    load_profile,
    max_utilisation,
    prefill_need,
)
from dynamoctl.planner.records import Forecast, TrafficSample
from tests.planner.helpers import PROFILE, model

pytestmark = pytest.mark.planner


def test_prefill_time_is_interpolated_and_extended() -> None:
    perf = model()
    assert perf.prefill_seconds(1500) == pytest.approx(0.175)
    assert perf.prefill_seconds(500) == pytest.approx(0.05)  # proportional below
    assert perf.prefill_seconds(3000) == pytest.approx(0.40)  # along the last segment
    assert perf.prefill_tokens_per_second() == pytest.approx(10_000)


def test_itl_is_interpolated_in_batch_and_context() -> None:
    perf = model()
    batches = np.array([1.0, 6.0, 11.0])
    assert perf.itl_seconds(batches, 1000) == pytest.approx([0.010, 0.015, 0.020])
    assert perf.itl_seconds(batches, 2000) == pytest.approx([0.015, 0.0225, 0.030])
    assert perf.itl_seconds(batches, 5000) == pytest.approx([0.030, 0.045, 0.060])
    assert perf.itl_seconds(batches, 10) == pytest.approx([0.010, 0.015, 0.020])


def test_max_utilisation_keeps_mean_ttft_at_target() -> None:
    # M/D/1: wait = u S / (2 (1 - u)); with S = 0.1, T = 0.5: u = 0.8 / 0.9.
    u = max_utilisation(0.1, 0.5)
    assert u == pytest.approx(0.8 / 0.9)
    assert 0.1 + u * 0.1 / (2 * (1 - u)) == pytest.approx(0.5)
    assert max_utilisation(0.5, 0.5) == 0.0


def test_prefill_replicas() -> None:
    perf = model()
    # 10 req/s x 0.1 s = 1.0 busy replica; / (0.8/0.9) = 1.125 -> 2.
    need = prefill_need(perf, Forecast(rate=10, isl=1000, osl=200), ttft_target=0.5)
    assert (need.replicas, need.meets_target) == (2, True)
    # A correction under 1 (prefix cache hits) shrinks the load; over 1 never grows it.
    halved = prefill_need(perf, Forecast(rate=10, isl=1000, osl=200), 0.5, factor=0.5)
    assert halved.replicas == 1
    assert prefill_need(perf, Forecast(rate=10, isl=1000, osl=200), 0.5, factor=3).replicas == 2
    # 0.25 s for 2000 tokens can never make a 0.2 s TTFT: sized to keep up (50 x 0.25).
    hopeless = prefill_need(perf, Forecast(rate=50, isl=2000, osl=10), ttft_target=0.2)
    assert (hopeless.replicas, hopeless.meets_target) == (13, False)
    assert "misses TTFT 200 ms" in hopeless.reason


def test_decode_replicas() -> None:
    perf = model()
    demand = Forecast(rate=10, isl=900, osl=200)  # context 1000, 2000 tokens/s
    # ITL 15 ms allows batch 6 (15 ms): 400 tokens/s a replica -> 5.
    need = decode_need(perf, demand, itl_target=0.015)
    assert (need.replicas, need.meets_target) == (5, True)
    # Observed ITL 1.5x the profile's: aim at 10 ms, batch 1, 100 tokens/s -> 20.
    assert decode_need(perf, demand, itl_target=0.015, factor=1.5).replicas == 20
    # Context 2000 (ITL 15 ms alone): batch 1 -> 2000 / 66.7 = 30.
    assert decode_need(perf, Forecast(rate=10, isl=1900, osl=200), 0.015).replicas == 30
    unreachable = decode_need(perf, demand, itl_target=0.005)
    assert (unreachable.replicas, unreachable.meets_target) == (20, False)


def test_kv_capacity_bounds_the_decode_batch() -> None:
    bounded = PerfModel(msgspec.structs.replace(PROFILE, kv_capacity_tokens=4000))
    # 4000 tokens / context 1000 = batch 4 (13 ms): 307.7 tokens/s -> 6.5 -> 7.
    assert bounded.batch_within(0.015, 1000) == (4, pytest.approx(0.013))
    assert decode_need(bounded, Forecast(rate=10, isl=900, osl=200), 0.015).replicas == 7


def test_aggregated_replicas_add_prefill_and_decode_shares() -> None:
    # Prefill 0.09 s at u = 0.82/0.91: 0.999; decode 2000 x 0.015 / 6 = 5.0 -> 6.
    need = agg_need(model(), Forecast(rate=10, isl=900, osl=200), 0.5, 0.015)
    assert (need.replicas, need.meets_target) == (6, True)


def test_corrections_compare_observed_latency_with_the_profile() -> None:
    perf = model()
    sample = TrafficSample(
        at=0, interval=60, requests=600, mean_isl=900, mean_osl=200,
        ttft=0.045, itl=0.0225, decode_batch=6.2,
    )  # fmt: skip
    assert corrections(perf, sample) == pytest.approx((0.5, 1.5))
    assert corrections(perf, None) == (1.0, 1.0)
    assert correction(10.0, 0.1) == 4.0  # clipped
    assert correction(None, 0.1) == 1.0


def test_a_profile_round_trips_and_other_versions_are_refused() -> None:
    data = msgspec.json.encode(PROFILE)
    assert load_profile(data) == PROFILE
    other = msgspec.json.encode(msgspec.structs.replace(PROFILE, version=2))
    with pytest.raises(ProfileError, match="version 2; this planner reads version 1"):
        load_profile(other)
    with pytest.raises(ProfileError, match="not a planner profile"):
        load_profile(b'{"version": 1, "model": "tiny"}')
    with pytest.raises(ProfileError, match="at least one prefill and one decode"):
        load_profile(msgspec.json.encode(msgspec.structs.replace(PROFILE, decode=())))


def test_a_profile_for_another_deployment_is_refused_naming_the_mismatch() -> None:
    check_profile(PROFILE, model="tiny", engine="mocker", gpus_per_replica=1)
    with pytest.raises(ProfileError) as refused:
        check_profile(PROFILE, model="big", engine="vllm", gpus_per_replica=1)
    assert str(refused.value) == (
        "profile was measured for another deployment: model 'tiny' (the pool's is 'big'),"
        " engine 'mocker' (the pool's is 'vllm')"
    )
    with pytest.raises(ProfileError, match="gpus_per_replica 1 \\(the pool's is 2\\)"):
        check_profile(PROFILE, model="tiny", engine="mocker", gpus_per_replica=2)
