"""The performance model: a measured profile of one engine serving one model on a number
of GPUs, its interpolation, and the replica formulas of the throughput loop.

The profile is what a profiling sweep writes (prefill time against prompt length; ITL
against batch size and context length). A profile is refused, naming what differs, when
it was measured for another model, engine or replica size. The formulas follow the
reference system's SLA planner, with the changes docs/planner.md, "Replica formulas",
explains: the prefill pool is sized for queueing at the TTFT target, not for 100% load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from dynamoctl.planner.records import Forecast, TrafficSample

FloatArray = npt.NDArray[np.float64]

PROFILE_VERSION = 1
"""The profile format this code reads."""

Positive = Annotated[float, msgspec.Meta(gt=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]

CORRECTION_RANGE = (0.25, 4.0)
"""Correction factors are clipped to this range: one odd interval (a cold cache, a burst
of tiny prompts) must not zero the sizing or multiply it without bound."""

_EPSILON = 1e-9
"""Slack on ``ceil`` so a need of exactly 2.0000000001 replicas (float noise) is 2."""


class ProfileError(ValueError):
    """A profile that cannot be used: unreadable, another format version, or measured for
    another deployment (the message names each difference)."""


class PrefillPoint(msgspec.Struct, frozen=True, kw_only=True):
    """Prefill of one prompt on an idle replica."""

    isl: Count
    """Prompt length, tokens."""
    seconds: Positive
    """Time from request to first token."""


class DecodePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Decode steps at one batch size and context length."""

    batch: Count
    """Requests decoding together."""
    context: Count
    """Tokens in each request's context (prompt + generated so far)."""
    itl: Positive
    """Seconds per decode step (every request in the batch gets one token)."""


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """Measured performance of one engine serving one model on ``gpus_per_replica``."""

    version: int
    """Format version (:data:`PROFILE_VERSION`)."""
    model: str
    """The served model, as the recipe names it."""
    engine: str
    """The engine (``mocker``, ``vllm``, ``sglang``, ``trtllm``)."""
    gpus_per_replica: int
    """GPUs of the measured replica (0: the mocker or a CPU engine)."""
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    kv_capacity_tokens: int | None = None
    """Tokens of KV cache per replica; bounds the decode batch at a context length."""
    source: str = ""
    """Where the numbers come from (a sweep of a deployment, a configurator database)."""


class _Versioned(msgspec.Struct):
    version: int


def load_profile(data: bytes | Path) -> Profile:
    """A profile from its JSON (bytes or a file); :class:`ProfileError` if it is not one
    this code reads."""
    raw = data.read_bytes() if isinstance(data, Path) else data
    try:
        version = msgspec.json.decode(raw, type=_Versioned).version
        if version != PROFILE_VERSION:
            raise ProfileError(
                f"profile format version {version}; this planner reads version "
                f"{PROFILE_VERSION} (measure the deployment again)"
            )
        profile = msgspec.json.decode(raw, type=Profile)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ProfileError(f"not a planner profile: {exc}") from None
    if not profile.prefill or not profile.decode:
        raise ProfileError("a profile needs at least one prefill and one decode point")
    return profile


def check_profile(profile: Profile, *, model: str, engine: str, gpus_per_replica: int) -> None:
    """Refuse ``profile`` for a pool that serves ``model`` on ``engine`` with
    ``gpus_per_replica``, naming every difference."""
    differences = [
        f"{what} {theirs!r} (the pool's is {ours!r})"
        for what, theirs, ours in (
            ("model", profile.model, model),
            ("engine", profile.engine, engine),
            ("gpus_per_replica", profile.gpus_per_replica, gpus_per_replica),
        )
        if theirs != ours
    ]
    if differences:
        raise ProfileError("profile was measured for another deployment: " + ", ".join(differences))


def correction(observed: float | None, expected: float | None) -> float:
    """``observed / expected`` clipped to :data:`CORRECTION_RANGE`; 1 when either is
    unknown."""
    if observed is None or expected is None or observed <= 0 or expected <= 0:
        return 1.0
    low, high = CORRECTION_RANGE
    return min(max(observed / expected, low), high)


def replicas_for(work: float) -> int:
    """Replicas that carry ``work`` replicas' worth of load (``ceil``, float noise aside)."""
    return max(0, math.ceil(work - _EPSILON))


class PerfModel:
    """A profile, interpolated.

    Prefill time is piecewise linear in prompt length, extended past the longest measured
    prompt along its last segment (attention makes it grow at least that fast) and scaled
    proportionally below the shortest. Decode ITL is piecewise linear in batch size at each
    measured context length, and linear in context between two of them (above the
    longest, along the last two; below the shortest, the shortest's: an over-estimate,
    the safe side)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        prefill = sorted(profile.prefill, key=lambda point: point.isl)
        self._isl = np.array([point.isl for point in prefill], dtype=float)
        self._prefill = np.array([point.seconds for point in prefill], dtype=float)
        curves: dict[int, list[DecodePoint]] = {}
        for point in profile.decode:
            curves.setdefault(point.context, []).append(point)
        self._contexts = sorted(curves)
        self._curves = [
            (
                np.array([p.batch for p in sorted(curves[c], key=lambda p: p.batch)], float),
                np.array([p.itl for p in sorted(curves[c], key=lambda p: p.batch)], float),
            )
            for c in self._contexts
        ]
        self.max_batch = int(min(batches[-1] for batches, _ in self._curves))
        """The largest batch measured at every context length (the model's range)."""

    def prefill_seconds(self, isl: float) -> float:
        """Time to prefill one prompt of ``isl`` tokens on an idle replica."""
        isl_points, seconds = self._isl, self._prefill
        if isl <= isl_points[0]:
            return float(seconds[0] * max(isl, 1.0) / isl_points[0])
        if isl <= isl_points[-1] or len(isl_points) == 1:
            return float(np.interp(isl, isl_points, seconds))
        slope = (seconds[-1] - seconds[-2]) / (isl_points[-1] - isl_points[-2])
        return float(seconds[-1] + max(slope, 0.0) * (isl - isl_points[-1]))

    def prefill_tokens_per_second(self) -> float:
        """A replica's best measured prefill rate (what a queue of prompts drains at)."""
        return float(np.max(self._isl / self._prefill))

    def itl_seconds(self, batch: FloatArray, context: float) -> FloatArray:
        """Decode step time at each of ``batch`` (within ``max_batch``) and ``context``."""
        at = [np.asarray(np.interp(batch, b, itl), float) for b, itl in self._curves]
        contexts = self._contexts
        if len(contexts) == 1 or context <= contexts[0]:
            return at[0]
        upper = min(int(np.searchsorted(contexts, context)), len(contexts) - 1)
        low, high = contexts[upper - 1], contexts[upper]
        share = (context - low) / (high - low)
        blended: FloatArray = at[upper - 1] + share * (at[upper] - at[upper - 1])
        return np.maximum(blended, at[-1]) if context > contexts[-1] else blended

    def batch_within(self, itl_target: float, context: float) -> tuple[int, float]:
        """The largest batch whose ITL at ``context`` is within ``itl_target`` (KV capacity
        permitting), and its ITL. When even one request misses the target: ``(0, ITL of
        one)``."""
        most = self.max_batch
        if self.profile.kv_capacity_tokens is not None:
            most = min(most, max(1, self.profile.kv_capacity_tokens // max(1, int(context))))
        batches = np.arange(1, most + 1, dtype=float)
        itl = self.itl_seconds(batches, context)
        fits = np.nonzero(itl <= itl_target)[0]
        if len(fits) == 0:
            return 0, float(itl[0])
        best = int(fits[-1])
        return best + 1, float(itl[best])


class PoolNeed(msgspec.Struct, frozen=True, kw_only=True):
    """Replicas a pool needs for a forecast, and the arithmetic, for the decision's reason."""

    replicas: int
    meets_target: bool
    """False: no replica count meets the target (one request alone misses it); the pool is
    sized to keep up with the load instead."""
    reason: str
    share: float = 0.0
    """The same need in replicas' worth of work, before rounding up (a backlog's share is
    added to it, then rounded once)."""


def max_utilisation(service: float, target: float) -> float:
    """How busy a replica may be for a mean TTFT within ``target`` when one prefill takes
    ``service``: requests arriving at random (Poisson) to a replica that serves them one
    at a time in ``service`` wait ``u*S / (2(1-u))`` on average (M/D/1), so
    ``S + wait <= T`` gives utilisation ``u <= 2(T-S) / (2T-S)``. 0 when ``service >= target``."""
    if service >= target:
        return 0.0
    return 2.0 * (target - service) / (2.0 * target - service)


def corrections(model: PerfModel, observed: TrafficSample | None) -> tuple[float, float]:
    """(prefill, decode) correction factors: observed TTFT and ITL over what the profile
    expects for the interval's lengths (and decode batch); 1 where unknown."""
    if observed is None or observed.requests == 0:
        return 1.0, 1.0
    prefill = correction(observed.ttft, model.prefill_seconds(observed.mean_isl))
    decode = 1.0
    if observed.decode_batch is not None and observed.itl is not None:
        batch = min(max(round(observed.decode_batch), 1), model.max_batch)
        context = observed.mean_isl + observed.mean_osl / 2
        expected = float(model.itl_seconds(np.array([float(batch)]), context)[0])
        decode = correction(observed.itl, expected)
    return prefill, decode


def prefill_need(
    model: PerfModel, forecast: Forecast, ttft_target: float, factor: float = 1.0
) -> PoolNeed:
    """Prefill replicas: ``rate * prefill_time(ISL) * min(1, c_p)`` replicas' worth of
    work (the reference's ``rate * ISL / throughput``), each replica at most
    :func:`max_utilisation` busy."""
    service = model.prefill_seconds(forecast.isl)
    busy = forecast.rate * service * min(1.0, factor)
    arithmetic = (
        f"{forecast.rate:.2f} req/s x {service * 1e3:.0f} ms prefill (ISL {forecast.isl:.0f})"
        f" x {min(1.0, factor):.2f} = {busy:.2f} busy"
    )
    utilisation = max_utilisation(service, ttft_target)
    if utilisation <= 0.0:
        return PoolNeed(
            replicas=replicas_for(busy),
            share=busy,
            meets_target=False,
            reason=f"{arithmetic}; one prefill alone misses TTFT {ttft_target * 1e3:.0f} ms",
        )
    needed = replicas_for(busy / utilisation)
    return PoolNeed(
        replicas=needed,
        share=busy / utilisation,
        meets_target=True,
        reason=f"{arithmetic}, at most {utilisation:.0%} busy for TTFT "
        f"{ttft_target * 1e3:.0f} ms -> {needed}",
    )


def decode_need(
    model: PerfModel, forecast: Forecast, itl_target: float, factor: float = 1.0
) -> PoolNeed:
    """Decode replicas: tokens per second ``rate * OSL`` over one replica's throughput at
    the largest batch whose ITL, at context ``ISL + OSL/2``, is within ``target / c_d``."""
    context = forecast.isl + forecast.osl / 2
    target = itl_target / factor
    batch, itl = model.batch_within(target, context)
    per_replica = max(batch, 1) / itl
    tokens = forecast.rate * forecast.osl
    needed = replicas_for(tokens / per_replica)
    arithmetic = (
        f"{tokens:.0f} tok/s / ({max(batch, 1)} x {1 / itl:.1f} tok/s at context "
        f"{context:.0f}) -> {needed}"
    )
    if batch == 0:
        return PoolNeed(
            replicas=needed,
            share=tokens / per_replica,
            meets_target=False,
            reason=f"{arithmetic}; one request alone misses ITL {target * 1e3:.1f} ms",
        )
    return PoolNeed(
        replicas=needed,
        share=tokens / per_replica,
        meets_target=True,
        reason=f"{arithmetic} within ITL {target * 1e3:.1f} ms (x1/{factor:.2f})",
    )


def agg_need(
    model: PerfModel,
    forecast: Forecast,
    ttft_target: float,
    itl_target: float,
    factors: tuple[float, float] = (1.0, 1.0),
) -> PoolNeed:
    """Aggregated replicas: a replica's time is shared between prefill and decode, so the
    two pools' needs (as fractions of a replica) add up."""
    service = model.prefill_seconds(forecast.isl)
    utilisation = max_utilisation(service, ttft_target)
    prefill_busy = forecast.rate * service * min(1.0, factors[0])
    prefill_share = prefill_busy / utilisation if utilisation > 0 else prefill_busy
    context = forecast.isl + forecast.osl / 2
    batch, itl = model.batch_within(itl_target / factors[1], context)
    decode_share = forecast.rate * forecast.osl * itl / max(batch, 1)
    needed = replicas_for(prefill_share + decode_share)
    return PoolNeed(
        replicas=needed,
        share=prefill_share + decode_share,
        meets_target=utilisation > 0 and batch > 0,
        reason=f"prefill {prefill_share:.2f} + decode {decode_share:.2f} replicas -> {needed}",
    )
