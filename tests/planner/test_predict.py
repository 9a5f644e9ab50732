"""Load predictors on synthetic series: a step, a ramp, a periodic load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamoctl.planner.predict import (
    PREDICTORS,
    ConstantPredictor,
    KalmanPredictor,
    MovingAveragePredictor,
    Predictor,
    TrafficForecaster,
)
from dynamoctl.planner.records import TrafficSample
from dynamoctl.planner.settings import PREDICTOR_KINDS
from dynamoctl.util.registry import UnknownName

pytestmark = pytest.mark.planner

STEP = [10.0] * 12 + [30.0] * 12
RAMP = [10.0 + 2.0 * i + (0.5 if i % 2 else -0.5) for i in range(24)]
PERIODIC = [20.0 + 10.0 * math.sin(2 * math.pi * i / 12) for i in range(36)]


def one_step_errors(predictor: Predictor, series: list[float], skip: int = 6) -> list[float]:
    """|forecast - value| for each value after the first ``skip``, forecast before seeing it."""
    errors = []
    for index, value in enumerate(series):
        forecast = predictor.predict()
        if index >= skip:
            assert forecast is not None and forecast >= 0
            errors.append(abs(forecast - value))
        predictor.observe(value)
    return errors


def test_the_registry_holds_the_settings_kinds() -> None:
    assert PREDICTORS.names() == list(PREDICTOR_KINDS)
    with pytest.raises(UnknownName, match="valid: constant, moving-average, kalman"):
        PREDICTORS["prophet"]


@pytest.mark.parametrize("kind", PREDICTOR_KINDS)
def test_nothing_seen_means_no_forecast(kind: str) -> None:
    predictor = PREDICTORS[kind](8)
    assert predictor.predict() is None
    predictor.observe(3.0)
    assert predictor.predict() == 3.0


def test_constant_follows_a_step_in_one_interval() -> None:
    errors = one_step_errors(ConstantPredictor(), STEP)
    assert errors[-11:] == [0.0] * 11


def test_moving_average_lags_a_step_by_its_window() -> None:
    average = MovingAveragePredictor(4)
    for value in STEP[:14]:
        average.observe(value)
    assert average.predict() == pytest.approx(20.0)  # two of four values after the step
    for value in STEP[14:]:
        average.observe(value)
    assert average.predict() == pytest.approx(30.0)


def test_kalman_settles_on_the_new_level_after_a_step() -> None:
    # The fitted trend keeps a little of the jump (as statsmodels' fit of the same model
    # does): within 5% of the new level six intervals after the step.
    kalman = KalmanPredictor(32)
    for value in STEP[:13]:
        kalman.observe(value)
    assert kalman.predict() > 25.0  # one interval after the step, most of the way there
    for value in STEP[13:18]:
        kalman.observe(value)
    assert kalman.predict() == pytest.approx(30.0, abs=1.5)


def test_kalman_follows_a_ramp_that_the_others_lag() -> None:
    kalman = np.mean(one_step_errors(KalmanPredictor(32), RAMP))
    constant = np.mean(one_step_errors(ConstantPredictor(), RAMP))
    average = np.mean(one_step_errors(MovingAveragePredictor(8), RAMP))
    assert kalman < 0.7 * constant < average  # the constant lags 2/interval, the mean 9


def test_kalman_tracks_a_periodic_load_better_than_a_moving_average() -> None:
    kalman = np.mean(one_step_errors(KalmanPredictor(32), PERIODIC))
    average = np.mean(one_step_errors(MovingAveragePredictor(8), PERIODIC))
    assert kalman < 0.5 * average


def test_kalman_is_scale_free_and_never_negative() -> None:
    small, large = KalmanPredictor(32), KalmanPredictor(32)
    for value in RAMP:
        small.observe(value)
        large.observe(1000 * value)
    assert large.predict() == pytest.approx(1000 * small.predict(), rel=1e-6)  # type: ignore[operator]
    falling = KalmanPredictor(32)
    for value in [50.0, 40.0, 30.0, 20.0, 10.0, 1.0]:
        falling.observe(value)
    assert falling.predict() == 0.0


def test_kalman_holds_a_flat_series_and_a_short_one() -> None:
    flat, short = KalmanPredictor(32), KalmanPredictor(32)
    for _ in range(10):
        flat.observe(7.0)
    for value in [1.0, 5.0, 9.0]:
        short.observe(value)
    assert (flat.predict(), short.predict()) == (7.0, 9.0)


def test_traffic_forecaster_learns_lengths_only_from_intervals_with_requests() -> None:
    forecaster = TrafficForecaster("constant", 8)
    forecaster.observe(TrafficSample(at=0, interval=60, requests=0))
    assert forecaster.forecast() is None  # a rate, but no lengths yet
    forecaster.observe(TrafficSample(at=60, interval=60, requests=120, mean_isl=900, mean_osl=200))
    forecaster.observe(TrafficSample(at=120, interval=60, requests=0))
    forecast = forecaster.forecast()
    assert forecast is not None
    assert (forecast.rate, forecast.isl, forecast.osl) == (0.0, 900, 200)


def test_the_forecast_carries_the_rate_trend_of_the_latest_intervals() -> None:
    forecaster = TrafficForecaster("constant", 8)
    for i, requests in enumerate([60, 60, 120, 180, 240]):  # +1 req/s each minute from 1
        sample = TrafficSample(at=60.0 * (i + 1), interval=60, requests=requests, mean_isl=900)
        forecaster.observe(sample)
    forecast = forecaster.forecast()
    assert forecast is not None and forecast.rate == 4.0
    assert forecast.trend == pytest.approx(1 / 60)  # the last four intervals, per second
