"""Tier-aware routing: the index keeps each worker's blocks per tier from vLLM-, mocker-
and LMCache-shaped events, and the ``kv`` cost credits a lower-tier hit by its worth."""

from __future__ import annotations

from typing import Any

import pytest

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, VirtualClock
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.kv.tiers import DEFAULT_DISK_CREDIT, DEFAULT_HOST_CREDIT, Tier, onboard_credit
from dynamoctl.router.index import KvIndex
from dynamoctl.router.router import KvRouter
from dynamoctl.wire.kv_events import BlockRemoved, BlockStored, KVEventBatch

pytestmark = pytest.mark.kv_tiers

B = 4


def tokens(seed: int, blocks: int) -> list[int]:
    return [seed * 100 + i for i in range(blocks * B)]


def stored(engine_hashes: list[int], toks: list[int], medium: str, parent: int | None = None):
    return BlockStored(engine_hashes, parent, toks, B, medium=medium)


def batch(*events: Any) -> KVEventBatch:
    return KVEventBatch(0.0, list(events))


def test_offloaded_blocks_count_in_their_tier_not_against_the_gpu_copy() -> None:
    index = KvIndex(B)
    index.add_worker("w")
    toks = tokens(1, 3)
    ours = sequence_hashes(toks, B)
    engine = [11, 12, 13]  # vLLM's names for the blocks, not ours
    index.apply_batch("w", batch(stored(engine, toks, "GPU")))
    assert index.find_tier_matches(ours) == {"w": (3, 3, 3)}
    # vLLM's offload connector: the same engine hashes in medium CPU, then GPU eviction.
    index.apply_batch("w", batch(stored(engine, toks, "CPU"), BlockRemoved(engine, "GPU")))
    assert index.find_matches(ours) == {}
    assert index.find_tier_matches(ours) == {"w": (0, 3, 3)}
    # Disk copy of the first two; the host loses the first: GPU 0, host 0, any tier 2.
    index.apply_batch(
        "w", batch(stored(engine[:2], toks[: 2 * B], "STORAGE"), BlockRemoved(engine[:1], "CPU"))
    )
    assert index.find_tier_matches(ours) == {"w": (0, 0, 3)}
    assert (index.tier_blocks("w", Tier.HOST), index.tier_blocks("w", Tier.DISK)) == (2, 2)
    index.apply_batch("w", batch(BlockRemoved(engine, "CPU"), BlockRemoved(engine, "STORAGE")))
    assert index.find_tier_matches(ours) == {}
    assert index.engine_blocks("w") == 0
    index.check()
    for lower in index.lower.values():
        lower.check()


def test_tokenless_lowercase_and_unknown_media() -> None:
    index = KvIndex(B)
    index.add_worker("w")
    toks = tokens(2, 2)
    ours = sequence_hashes(toks, B)
    index.apply_batch("w", batch(stored([1, 2], toks, "GPU")))
    # Not self-describing (vLLM's placeholder) and lower case (LMCache outside MP mode).
    index.apply_batch("w", batch(BlockStored([1, 2], None, [], 0, medium="cpu")))
    index.apply_batch("w", batch(stored([1, 2], toks, "TAPE")))  # unknown: ignored
    index.apply_batch("w", batch(BlockRemoved([1, 2], "GPU")))
    assert index.find_tier_matches(ours) == {"w": (0, 2, 2)}
    assert index.tier_blocks("w", Tier.DISK) == 0


def test_silent_tier_ages_out_by_capacity_lru() -> None:
    index = KvIndex(B)
    index.add_worker("w")
    index.set_silent_tier("w", Tier.HOST, 4)
    toks = tokens(3, 6)
    ours = sequence_hashes(toks, B)
    # LMCache's own chunk hashes, chained; no CPU evictions are ever sent.
    for i in range(6):
        parent = 900 + i - 1 if i else None
        index.apply_batch("w", batch(stored([900 + i], toks[i * B : (i + 1) * B], "CPU", parent)))
    assert index.tier_blocks("w", Tier.HOST) == 4
    assert index.aged_out == 2
    # The prefix's root aged out: nothing is a hit any more (contiguity from block 0).
    assert index.find_tier_matches(ours) == {}
    # A store of a held block makes it young again instead of counting it twice.
    index.apply_batch("w", batch(stored([902], toks[2 * B : 3 * B], "CPU", 901)))
    index.apply_batch("w", batch(stored([906], tokens(4, 1), "CPU")))
    assert index.tier_blocks("w", Tier.HOST) == 4
    index.check()
    index.lower[Tier.HOST].check()


def test_router_takes_silent_tiers_by_medium() -> None:
    router = KvRouter("kv", B)
    router.add_worker("w")
    router.set_silent_tiers("w", {"CPU": 3, "TAPE": 9, "GPU": 5})  # only offload tiers
    router.set_silent_tiers("unknown", {"CPU": 3})  # not a worker: nothing to age
    assert router.index.silent_capacity("w", Tier.HOST) == 3
    assert router.index.silent_capacity("w", Tier.GPU) is None
    assert router.index.silent_capacity("unknown", Tier.HOST) is None


def router_with(workers: dict[str, str | None], **kw: Any) -> tuple[KvRouter, list[int]]:
    """A router over workers each holding a 16-block prompt in the medium given (None:
    nothing)."""
    router = KvRouter("kv", B, seed=1, **kw)
    toks = tokens(5, 16)
    for n, (worker, medium) in enumerate(workers.items()):
        router.add_worker(worker)
        if medium is not None:
            engine = [1000 * n + i for i in range(16)]
            router.apply_kv_batch(worker, batch(stored(engine, toks, medium)))
    return router, [*toks, 1, 2, 3]


def test_cost_credits_a_hit_by_tier() -> None:
    router, prompt = router_with({"gpu": "GPU", "host": "CPU", "disk": "STORAGE", "none": None})
    decision = router.pick(prompt, "r1")
    assert (decision.worker_id, decision.overlap_blocks) == ("gpu", 16)
    router.remove_worker("gpu")
    decision = router.pick(prompt, "r2")
    assert (decision.worker_id, decision.overlap_blocks, decision.tier_blocks) == ("host", 0, 16)
    # Booked prefill: the host hit is worth DEFAULT_HOST_CREDIT of a prefill.
    booked = router.load.loads(["host"])[0][0]
    assert booked == len(prompt) - round(DEFAULT_HOST_CREDIT * 16 * B)
    router.remove_worker("host")
    assert router.pick(prompt, "r3").worker_id == "disk"


def test_without_tier_credit_a_lower_tier_is_a_miss() -> None:
    for credit, expected in ((DEFAULT_HOST_CREDIT, "host"), (0.0, "none")):
        router, prompt = router_with({"host": "CPU", "none": None}, host_credit=credit)
        # Some load on the host-tier worker: only the tier credit outweighs it.
        router.pick(tokens(9, 2), "other", exclude=["none"])
        assert router.pick(prompt, "r").worker_id == expected


def test_credit_formula() -> None:
    # 8 MiB blocks at 25 GB/s: 0.34 ms to onboard, vs 64 x 15.2 us = 0.97 ms to prefill.
    assert onboard_credit(64 * 131072, 25.0, 1.518344e-2, 64) == pytest.approx(0.6547, abs=1e-4)
    assert onboard_credit(64 * 131072, 1.0, 1.518344e-2, 64) == 0.0  # slower than recompute
    assert (DEFAULT_HOST_CREDIT, DEFAULT_DISK_CREDIT) == (0.65, 0.14)


async def test_router_sends_an_evicted_prompt_to_the_worker_holding_it_in_host_memory() -> None:
    config = MockerConfig(block_size=B, num_gpu_blocks=8, num_host_blocks=32)
    router = KvRouter("kv", B, seed=3)
    engines = {}
    for name in ("a", "b"):
        engine = MockerEngine(config, clock=VirtualClock())
        engine.set_kv_event_sink(lambda b, name=name: router.apply_kv_batch(name, b))
        await engine.start()
        router.add_worker(name)
        engines[name] = engine

    async def run(worker: str, rid: str, prompt: list[int]) -> int:
        first = None
        async for chunk in engines[worker].generate(GenerateRequest(rid, prompt, 1)):
            first = chunk.cached_tokens if first is None else first
        return first or 0

    try:
        prompt = [*tokens(7, 4), 1]
        await run("a", "p1", prompt)
        await run("a", "evict", [*tokens(8, 7), 1])  # a's 8-block pool drops the prompt
        hashes = sequence_hashes(prompt, B)
        assert router.index.find_matches(hashes) == {}
        assert router.index.find_tier_matches(hashes) == {"a": (0, 4, 4)}
        decision = router.pick(prompt, "p2")
        assert (decision.worker_id, decision.tier_blocks) == ("a", 4)
        assert await run(decision.worker_id, "p2", prompt) == 4 * B
    finally:
        for engine in engines.values():
            await engine.stop()
