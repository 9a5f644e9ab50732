"""The planner's performance profile from AI Configurator instead of a measured sweep.

:mod:`dynamoctl.planner.perf` sizes pools from a profile of one replica shape: prefill
time against prompt length, ITL against batch size and context length. ``dynamoctl
configure --profile-out`` writes that format (unchanged) for the chosen configuration's
decode pool (the agg pool for agg), with its parallelism, from the same step latencies the
mocker's ``aic`` timing uses, and AI Configurator's KV capacity for that instance: what
``dynamoctl profile`` would measure on that replica if AI Configurator's data holds
(docs/configure.md, "A planner profile")."""

from __future__ import annotations

from pathlib import Path

import msgspec

from dynamoctl.configure import aic
from dynamoctl.configure.models import Answer, Candidate
from dynamoctl.planner.perf import PROFILE_VERSION, DecodePoint, PrefillPoint, Profile


def build_profile(answer: Answer, candidate: Candidate, served_name: str) -> Profile:
    q = answer.question
    pool = candidate.agg or candidate.decode
    assert pool is not None
    steps = aic.step_latency(q.model, q.system, q.engine, answer.engine_version, pool.parallel)
    prompts = aic.geometric(64, max(2 * q.isl, 4096), 2.0)
    batches = aic.geometric(1, max(8, 2 * pool.batch_size), 2.0)
    contexts = aic.geometric(128, max(256, 2 * (q.isl + q.osl)), 2.0)
    capacity = aic.kv_capacity_tokens(
        q.model, q.system, q.engine, answer.engine_version, pool.parallel,
        max_batch=pool.batch_size, max_step_tokens=q.isl + pool.batch_size,
    )  # fmt: skip
    return Profile(
        version=PROFILE_VERSION,
        model=served_name,
        engine=q.engine,
        gpus_per_replica=pool.parallel.gpus,
        prefill=tuple(PrefillPoint(isl=n, seconds=steps.prefill_ms(n) / 1e3) for n in prompts),
        decode=tuple(
            DecodePoint(batch=b, context=c, itl=steps.decode_ms(b, c) / 1e3)
            for c in contexts
            for b in batches
        ),
        kv_capacity_tokens=capacity,
        source=(
            f"AI Configurator {aic.PINNED}: {q.model} on {q.system} ({q.engine} "
            f"{answer.engine_version}), {pool.parallel.label()}"
        ),
    )


def write_profile(answer: Answer, candidate: Candidate, served_name: str, path: Path) -> Path:
    profile = build_profile(answer, candidate, served_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")
    return path
