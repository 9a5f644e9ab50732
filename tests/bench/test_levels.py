"""A sweep's load levels each send their own prompts: a level replaying the previous one's
would be served from the prefix cache and report hits (and TTFTs) the workload does not have.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from dynamoctl.bench.runner import BenchConfig, run_bench
from dynamoctl.bench.schedule import Limits
from dynamoctl.bench.workload import LengthDist, synthetic_sessions
from tests.bench.conftest import FakeServer

BLOCK = 16
ISL = 32
PER_LEVEL = 8
LOADS = pytest.mark.parametrize(
    "load", [{"concurrency": [1, 4]}, {"rates": [200.0, 400.0]}], ids=["closed", "open"]
)


def sweep(server: FakeServer, load: dict[str, object], **kw: object) -> BenchConfig:
    return BenchConfig(
        target=server.url,
        model="m",
        isl=str(ISL),
        osl="2",
        limits=Limits(max_requests=PER_LEVEL, max_seconds=30, drain_seconds=10),
        **load,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def token_ids(body: dict[str, object]) -> tuple[int, ...]:
    prompt = body["prompt"]
    assert isinstance(prompt, list)
    return tuple(prompt)


@LOADS
async def test_a_level_finds_nothing_of_the_previous_level_in_the_cache(
    fake_server: FakeServer, load: dict[str, object]
) -> None:
    fake_server.cache_block = BLOCK
    result = await run_bench(sweep(fake_server, load), console=Console(quiet=True))
    first, second = (run.summary for run in result.runs)
    assert (first.completed, second.completed) == (PER_LEVEL, PER_LEVEL)
    assert first.prefix_hit_rate == 0.0
    assert second.prefix_hit_rate == 0.0  # was 1.0: the second level resent the first's prompts
    sent = {token_ids(body) for body in fake_server.requests}
    assert len(sent) == 2 * PER_LEVEL


@LOADS
async def test_shared_prefixes_stay_shared_across_levels(
    fake_server: FakeServer, load: dict[str, object]
) -> None:
    fake_server.cache_block = BLOCK
    cfg = sweep(fake_server, load, shared_prefix=BLOCK, prefix_groups=1)
    result = await run_bench(cfg, console=Console(quiet=True))
    second = result.runs[1].summary
    # every prompt of the second level finds the system prompt cached, and only that
    assert second.cached_tokens == PER_LEVEL * BLOCK
    assert second.prefix_hit_rate == pytest.approx(BLOCK / (BLOCK + ISL), abs=1e-3)  # rounded
    prefixes = {token_ids(body)[:BLOCK] for body in fake_server.requests}
    assert len(prefixes) == 1


def prompts(level: int | None, seed: int = 7) -> list[list[int]]:
    """The first prompts of ``level`` (None: not passing it, as scripts in benchmarks/ do)."""
    kw = {} if level is None else {"level": level}
    sessions = synthetic_sessions(LengthDist.parse("uniform:8:24"), LengthDist.parse("4"),
                                  shared_prefix=16, prefix_groups=2, seed=seed, **kw)  # fmt: skip
    return [s.prefix + s.turns[0].new_tokens for s, _ in zip(sessions, range(6), strict=False)]


def test_levels_draw_different_sessions_from_one_seed() -> None:
    level0, level1 = prompts(0), prompts(1)
    assert prompts(1) == level1  # still seeded: a rerun sends the same prompts
    assert prompts(None) == level0  # level 0 is what the default always sent
    assert [p[:16] for p in level0] == [p[:16] for p in level1]  # the groups' system prompts
    assert all(a[16:] != b[16:] for a in level0 for b in level1)
