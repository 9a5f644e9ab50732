"""Measuring a performance profile: a sweep of one deployed replica through its frontend.

Requests go out with the load generator's client (``bench/client.py``), so times are what a
user sees, and each prompt is fresh token ids (no prefix-cache hit).

- **Prefill**: per prompt length, ``repeats`` requests one at a time, one output token
  each; the point is their median TTFT.
- **Decode**: per (batch, context), ``batch`` requests sent together, each with a prompt of
  ``context - osl/2`` tokens and ``osl`` output tokens, so their mean context while they
  decode is ``context``. ITL is the time per token while *every* request of the batch decodes
  (after the batch's last first token, before its first end; :func:`steady_itl`): the
  batch's own prefills are not decode time.

docs/planner.md, "Profiles", says how to run it and what the file holds.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import msgspec
from pydantic import Field, field_validator, model_validator

from dynamoctl.bench.client import RequestRecord, Sender
from dynamoctl.bench.workload import TOKEN_HI, Conversation, Session, Turn
from dynamoctl.planner.perf import PROFILE_VERSION, DecodePoint, PrefillPoint, Profile
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.workers import WorkerPool
from dynamoctl.settings.base import Options


class SweepError(RuntimeError):
    """A point could not be measured (the message names the point and what went wrong)."""


def _counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"at least one value, each >= 1, got {text!r}")
    return tuple(sorted(set(values)))


class SweepPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The points a sweep measures."""

    isl: tuple[int, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    osl: int
    repeats: int
    timeout: float
    seed: int = 0
    max_token_id: int = TOKEN_HI

    def decode_prompt(self, context: int) -> int:
        """Prompt length whose requests decode, on average, at ``context`` tokens."""
        return context - self.osl // 2


class ProfileOptions(Options):
    """What ``dynamoctl profile`` measures and where it writes it (declared once)."""

    FLAGS: ClassVar[dict[str, str]] = {"batches": "batch", "contexts": "context"}

    pool: str = ""
    """Worker pool whose engine and GPUs the profile names (default: agg, else decode)."""
    out: Path | None = None
    """Profile file to write (default: profile-RECIPE_NAME-POOL.json)."""
    isl: str = "128,512,1024,2048"
    """Prompt lengths at which prefill time is measured (comma-separated)."""
    batches: str = "1,4,8,16"
    """Decode batch sizes at which ITL is measured (comma-separated)."""
    contexts: str = "512,2048"
    """Context lengths (prompt + half the output) at which ITL is measured."""
    osl: int = Field(default=32, ge=4, le=4096)
    """Output tokens of each decode request (the longer, the more gaps per point)."""
    repeats: int = Field(default=3, ge=1, le=100)
    """Prefill requests per prompt length (their median is the point)."""
    timeout: float = Field(default=120.0, ge=1.0)
    """Seconds one request (or one decode batch) may take."""
    seed: int | None = None
    """Prompt seed (default: a new one each run, so that a second profile of the same
    deployment finds none of the first one's prompts in the prefix cache)."""
    max_token_id: int = Field(default=TOKEN_HI, ge=16)
    """Prompt token ids are drawn from [N/8, N): set it below a small model's vocabulary."""

    @field_validator("isl", "batches", "contexts")
    @classmethod
    def _lists(cls, value: str) -> str:
        _counts(value)
        return value

    @model_validator(mode="after")
    def _contexts_hold_a_prompt(self) -> ProfileOptions:
        short = [c for c in _counts(self.contexts) if c - self.osl // 2 < 1]
        if short:
            raise ValueError(
                f"context {short[0]} leaves no prompt with --osl {self.osl}: each context "
                "must exceed osl/2"
            )
        return self

    def plan(self) -> SweepPlan:
        return SweepPlan(
            isl=_counts(self.isl),
            batches=_counts(self.batches),
            contexts=_counts(self.contexts),
            osl=self.osl,
            repeats=self.repeats,
            timeout=self.timeout,
            seed=self.seed if self.seed is not None else random.SystemRandom().randrange(1 << 31),
            max_token_id=self.max_token_id,
        )


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """What a profile is of: checked by ``perf.check_profile`` against the planned pool."""

    model: str
    engine: str
    gpus_per_replica: int


def pool_identity(recipe: Recipe, pool: str) -> tuple[str, Identity]:
    """The pool a profile of ``recipe`` is of (``pool``, or agg, else decode) and its
    identity; ValueError naming the pools when there is no such pool."""
    pools: dict[str, WorkerPool] = {str(r): p for r, p in recipe.workers.pools().items()}
    name = pool or next((p for p in ("agg", "decode") if p in pools), "")
    if name not in pools:
        raise ValueError(f"no worker pool {name or pool!r} (pools: {', '.join(pools)})")
    spec = pools[name]
    identity = Identity(
        model=recipe.model.name, engine=spec.engine, gpus_per_replica=spec.gpus_per_replica
    )
    return name, identity


def token_times(record: RequestRecord) -> list[float]:
    """When each content chunk of a successful request arrived (the run's time origin)."""
    assert record.ttft is not None
    times = [record.start + record.ttft]
    for gap in record.gaps:
        times.append(times[-1] + gap)
    return times


def steady_itl(records: list[RequestRecord]) -> float | None:
    """Seconds per output token while every request of a batch was decoding: the window
    from the batch's last first token to its first last token, over the tokens each
    request got in it (on average). Counting tokens over a window, rather than taking the
    gaps between chunks, holds when an engine delivers tokens in bursts (gaps of 0, then
    one long one) or several in a chunk. None when the window holds no token."""
    times = [token_times(r) for r in records]
    start = max(t[0] for t in times)
    end = min(t[-1] for t in times)
    tokens = [
        sum(1 for x in t if start < x <= end) * r.output_tokens / len(t)
        for r, t in zip(records, times, strict=True)
    ]
    mean = sum(tokens) / len(tokens)
    return (end - start) / mean if end > start and mean >= 1 else None


class Sweeper:
    """Sends the sweep's requests through ``sender`` (one replica's endpoint)."""

    def __init__(self, sender: Sender, plan: SweepPlan) -> None:
        self.sender = sender
        self.plan = plan
        self._rng = random.Random(f"profile/{plan.seed}")
        self._ids = iter(range(1 << 62))

    def _sessions(self, count: int, prompt: int, max_tokens: int) -> Iterator[Session]:
        high = self.plan.max_token_id
        for _ in range(count):
            tokens = [self._rng.randrange(high // 8, high) for _ in range(prompt)]
            turn = Turn(tokens, max_tokens)
            yield Session(next(self._ids), [], [turn])

    async def _send(self, session: Session, origin: float, what: str) -> RequestRecord:
        conv = Conversation(session, "completions", text=False)
        record = await self.sender.send(conv, origin)
        if record.error is not None:
            raise SweepError(f"{what}: {record.error}: {record.detail}")
        return record

    async def prefill(self, isl: int) -> PrefillPoint:
        """Median TTFT of ``repeats`` lone requests of ``isl`` prompt tokens."""
        ttfts = []
        for session in self._sessions(self.plan.repeats, isl, 1):
            record = await self._send(session, self.sender.clock.now(), f"prefill ISL {isl}")
            assert record.ttft is not None
            ttfts.append(record.ttft)
        return PrefillPoint(isl=isl, seconds=max(statistics.median(ttfts), 1e-6))

    async def decode(self, batch: int, context: int) -> DecodePoint:
        """Steady ITL of ``batch`` requests decoding at ``context`` on average."""
        what = f"decode batch {batch} context {context}"
        origin = self.sender.clock.now()
        prompt = self.plan.decode_prompt(context)
        sends = [self._send(s, origin, what) for s in self._sessions(batch, prompt, self.plan.osl)]
        try:
            records = await asyncio.wait_for(asyncio.gather(*sends), self.plan.timeout)
        except asyncio.TimeoutError:
            raise SweepError(f"{what}: not done after {self.plan.timeout:g} s") from None
        itl = steady_itl(list(records))
        if itl is None:
            raise SweepError(
                f"{what}: the batch never decoded all together (its requests' prefills did "
                "not overlap their decodes): raise --osl, or lower the batch under the "
                "engine's max_num_seqs"
            )
        return DecodePoint(batch=batch, context=context, itl=max(itl, 1e-6))


async def sweep(
    sender: Sender,
    plan: SweepPlan,
    identity: Identity,
    *,
    source: str,
    on_point: Callable[[PrefillPoint | DecodePoint], None] = lambda point: None,
) -> Profile:
    """Measure every point of ``plan`` in order (prefill first, then decode by context and
    batch), one at a time so points never load each other."""
    sweeper = Sweeper(sender, plan)
    prefill: list[PrefillPoint] = []
    for isl in plan.isl:
        prefill.append(await sweeper.prefill(isl))
        on_point(prefill[-1])
    decode: list[DecodePoint] = []
    for context in plan.contexts:
        for batch in plan.batches:
            decode.append(await sweeper.decode(batch, context))
            on_point(decode[-1])
    return Profile(
        version=PROFILE_VERSION,
        model=identity.model,
        engine=identity.engine,
        gpus_per_replica=identity.gpus_per_replica,
        prefill=tuple(prefill),
        decode=tuple(decode),
        source=source,
    )


def encode_profile(profile: Profile) -> bytes:
    """The profile file's bytes (indented JSON, what ``perf.load_profile`` reads)."""
    return msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n"
