"""Load predictors: what the next throughput interval will bring (request rate, prompt and
output lengths), from the intervals seen so far.

Three behind one protocol, by name in :data:`PREDICTORS`: ``constant`` (the last value),
``moving-average`` and ``kalman``, a local-linear-trend state-space model whose two noise
ratios are fitted to the series by maximum likelihood, written against numpy.
Why not a library's (statsmodels, filterpy, pmdarima): docs/planner.md, "Predictors"."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dynamoctl.planner.ahead import level_shift, rate_trend
from dynamoctl.planner.records import Forecast, TrafficSample
from dynamoctl.util.registry import Registry

FloatArray = npt.NDArray[np.float64]


class Predictor(Protocol):
    """Forecasts the next value of one series (non-negative: rates and lengths)."""

    def observe(self, value: float) -> None:
        """Add the value of the interval that just ended."""

    def predict(self) -> float | None:
        """The next interval's value; ``None`` before any observation."""


TREND_INTERVALS = 4
"""Intervals the rate's trend is fitted over (short: a ramp is seen within a minute or two)."""

PredictorFactory = Callable[[int], Predictor]
"""Builds a predictor that keeps ``window`` values of history."""

PREDICTORS: Registry[PredictorFactory] = Registry("load predictor")
"""Predictors by name (``PlannerSettings.predictor``)."""


class ConstantPredictor:
    """Next = last: reacts in one interval, forecasts no change."""

    def __init__(self, window: int = 1) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        """Keep ``value`` as the forecast."""
        self._last = value

    def predict(self) -> float | None:
        """The last value observed."""
        return self._last


class MovingAveragePredictor:
    """Next = mean of the last ``window`` values: smooth, but lags a trend by half its
    width."""

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        """Add ``value``, dropping the oldest beyond the window."""
        self._values.append(value)

    def predict(self) -> float | None:
        """The mean of the window."""
        return sum(self._values) / len(self._values) if self._values else None


class KalmanPredictor:
    """Local linear trend: ``y = level + noise``, the level moves by a trend plus noise, the
    trend itself drifts. The level, trend and their noise are what the reference system's
    Kalman predictor models too, but its noise variances are constants (``q_level 1``,
    ``q_trend 0.1``, ``r 10``) that mean different things for 2 and 2,000 requests per
    interval; here the series is standardised and the two noise ratios are fitted by
    maximum likelihood each time a forecast is asked for (the model statsmodels calls
    ``UnobservedComponents("local linear trend")``; docs/planner.md compares the two).
    Fewer than :attr:`MIN_POINTS` values, or a flat series: the last value."""

    MIN_POINTS = 5
    """Values needed before the trend is trusted (the reference's ``min_points``)."""

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        """Add ``value``; the fit happens at :meth:`predict`."""
        self._values.append(value)

    def predict(self) -> float | None:
        """The one-step-ahead forecast (level + trend), never below 0."""
        if not self._values:
            return None
        series = np.asarray(self._values, dtype=float)
        scale = float(series.std())
        if len(series) < self.MIN_POINTS or scale <= 1e-9 * max(1.0, abs(float(series[-1]))):
            return float(series[-1])
        standard = (series - series.mean()) / scale
        # Every candidate pair of noise ratios at once: the filter is vectorised over them.
        fit, level, trend = _filter(standard, _GRID_LEVEL, _GRID_TREND)
        best = int(np.argmin(fit))
        return max(0.0, float(series.mean()) + scale * float(level[best] + trend[best]))


def _log_grid(low: float, high: float) -> FloatArray:
    return np.asarray(np.exp(np.arange(low, high + 1e-9, 0.25)), dtype=np.float64)


# Noise ratios (to the observation noise) tried by the fit: a grid in log space, fine
# enough (x1.28 apart) that the likelihood is flat between neighbours, and deterministic
# where an optimiser on 5 to 30 points warns and wanders.
_GRID_LEVEL, _GRID_TREND = (
    axis.ravel() for axis in np.meshgrid(_log_grid(-9.0, 4.0), _log_grid(-12.0, 4.0))
)

_DIFFUSE = 1e6
"""Initial state variance (the series is standardised, so this is "unknown")."""


def _filter(
    series: FloatArray, level_ratio: FloatArray, trend_ratio: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Run the local-linear-trend Kalman filter over ``series`` once per pair of noise
    ratios (observation variance 1, level and trend noise variances the ratios). Returns,
    per pair, the concentrated -2 log-likelihood (observation variance profiled out; the
    first two innovations, which only locate the diffuse state, left out), and the final
    level and trend."""
    shape = level_ratio.shape
    level, trend = np.zeros(shape), np.zeros(shape)
    p11, p12, p22 = np.full(shape, _DIFFUSE), np.zeros(shape), np.full(shape, _DIFFUSE)
    log_det, weighted = np.zeros(shape), np.zeros(shape)
    for step, value in enumerate(series.tolist()):
        # Predict: x = F x, P = F P F' + Q with F = [[1, 1], [0, 1]].
        level = level + trend
        p11, p12, p22 = p11 + 2 * p12 + p22 + level_ratio, p12 + p22, p22 + trend_ratio
        # Update with the observation of the level (H = [1, 0]).
        innovation, variance = value - level, p11 + 1.0
        gain_level, gain_trend = p11 / variance, p12 / variance
        level = level + gain_level * innovation
        trend = trend + gain_trend * innovation
        p11, p12, p22 = p11 - gain_level * p11, p12 - gain_level * p12, p22 - gain_trend * p12
        if step >= 2:
            log_det += np.log(variance)
            weighted += innovation * innovation / variance
    counted = max(len(series) - 2, 1)
    sigma2 = np.maximum(weighted / counted, 1e-12)
    return log_det + counted * np.log(sigma2), level, trend


PREDICTORS.add("constant", ConstantPredictor)
PREDICTORS.add("moving-average", MovingAveragePredictor)
PREDICTORS.add("kalman", KalmanPredictor)


class TrafficForecaster:
    """One predictor of the chosen kind per series: request rate, ISL and OSL."""

    def __init__(self, kind: str, window: int) -> None:
        factory = PREDICTORS[kind]
        self.kind = kind
        """The predictors' name (for decisions' reasons)."""
        self._rate, self._isl, self._osl = factory(window), factory(window), factory(window)
        self._rates: deque[tuple[float, float]] = deque(maxlen=TREND_INTERVALS)
        """(when, requests/s) of the latest intervals: the rate's trend."""

    def observe(self, sample: TrafficSample) -> None:
        """Add an interval. One with no request says nothing about lengths: only its rate
        (0) is added."""
        self._rate.observe(sample.requests / sample.interval)
        self._rates.append((sample.at, sample.requests / sample.interval))
        if sample.requests > 0:
            self._isl.observe(sample.mean_isl)
            self._osl.observe(sample.mean_osl)

    def forecast(self) -> Forecast | None:
        """The next interval, or ``None`` until an interval with requests was seen. When
        the latest rates are a level shift (:func:`~dynamoctl.planner.ahead.level_shift`),
        the rate is the new level (or the predictor's, if higher) with no trend."""
        rate, isl, osl = self._rate.predict(), self._isl.predict(), self._osl.predict()
        if rate is None or isl is None or osl is None:
            return None
        rates = list(self._rates)
        shifted = level_shift(rates)
        if shifted is not None:  # a step: the new level now, no trend to carry ahead
            return Forecast(rate=max(shifted, rate, 0.0), isl=max(isl, 0.0), osl=max(osl, 0.0))
        trend = rate_trend(rates)
        return Forecast(rate=max(rate, 0.0), isl=max(isl, 0.0), osl=max(osl, 0.0), trend=trend)
