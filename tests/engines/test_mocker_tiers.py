"""The mocker's KV tiers: offload on GPU eviction, onboarding at a bandwidth cost on the
virtual clock, vLLM-style tier events, the disk-offload filter and a full disk."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker import MockerConfig
from dynamoctl.engines.mocker.timing import TimingModel
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.kv.tiers import Tier
from dynamoctl.router.index import KvIndex
from dynamoctl.wire.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from dynamoctl.worker.kv_state import KvCacheState

pytestmark = pytest.mark.kv_tiers

BS = 4
BASE: dict[str, Any] = {"block_size": BS, "num_gpu_blocks": 8, "max_num_batched_tokens": 64}


def prompt(seed: int, blocks: int) -> list[int]:
    """``blocks`` full blocks plus one token (the last one is always computed)."""
    return [seed * 1000 + i for i in range(blocks * BS + 1)]


def tier_contents(batches: list[KVEventBatch]) -> dict[str, set[int]]:
    """What a subscriber holds per medium after applying every event in order."""
    held: dict[str, set[int]] = {MEDIUM_GPU: set(), MEDIUM_CPU: set(), MEDIUM_STORAGE: set()}
    for batch in batches:
        for event in batch.events:
            if isinstance(event, BlockStored):
                held[event.medium or MEDIUM_GPU].update(int(h) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held[event.medium or MEDIUM_GPU].difference_update(
                    int(h) for h in event.block_hashes
                )
    return held


async def test_evicted_prefix_is_onboarded_from_host_at_bandwidth_cost(make_mocker: Any) -> None:
    timing = TimingModel()
    tiered = await make_mocker(**BASE, num_host_blocks=16, host_gbps=0.001)
    plain = await make_mocker(**BASE)
    for m in (tiered, plain):
        await m.run("a", prompt(1, 4), 1)
        await m.run("b", prompt(2, 7), 1)  # evicts a's blocks from the 8-block GPU pool
        start = m.clock.now()
        out = await m.run("a2", prompt(1, 4), 1)
        m.ttft = out.times[0] - start
        m.cached_again = out.cached
    assert plain.cached_again == 0
    assert tiered.cached_again == 4 * BS
    block_bytes = MockerConfig(**BASE).block_bytes
    onboard_s = 4 * block_bytes / (0.001 * 1e9)
    assert tiered.ttft == pytest.approx(timing.prefill_ms(1) / 1e3 + onboard_s, rel=1e-9)
    assert plain.ttft == pytest.approx(timing.prefill_ms(4 * BS + 1) / 1e3, rel=1e-9)

    stats = {s.tier: s for s in tiered.engine.kv_tier_stats()}
    assert stats[Tier.HOST].onboarded_blocks == 4
    assert stats[Tier.HOST].hit_blocks == 4
    assert stats[Tier.HOST].offloaded_blocks >= 4
    assert stats[Tier.GPU].lookup_blocks == 4 + 7 + 4


async def test_a_load_delays_only_its_request_while_others_compute(make_mocker: Any) -> None:
    """A request waiting for host blocks does not hold up a fresh prompt admitted with it
    (the old model charged the load to the whole step): the fresh one's TTFT is its own
    prefill, and the load overlaps that compute."""
    timing = TimingModel()
    m = await make_mocker(**BASE, num_host_blocks=16, host_gbps=0.001)
    await m.run("a", prompt(1, 4), 1)
    await m.run("b", prompt(2, 7), 1)  # evicts a's blocks to the host tier
    start = m.clock.now()
    loaded, fresh = await asyncio.gather(m.run("a2", prompt(1, 4), 1), m.run("c", prompt(3, 2), 1))
    load_s = 4 * MockerConfig(**BASE).block_bytes / (0.001 * 1e9)
    assert load_s > timing.prefill_ms(2 * BS + 1) / 1e3  # the fresh prefill ends first
    assert fresh.times[0] - start == pytest.approx(timing.prefill_ms(2 * BS + 1) / 1e3)
    assert loaded.cached == 4 * BS
    assert loaded.times[0] - start == pytest.approx(load_s + timing.prefill_ms(1) / 1e3)
    m.engine.scheduler.check_invariants()


async def test_loads_queue_on_the_one_host_to_gpu_link(make_mocker: Any) -> None:
    """Two requests loading from the host: the second load starts when the first ends,
    and each request computes as soon as its own load is done."""
    timing = TimingModel()
    m = await make_mocker(**BASE, num_host_blocks=16, host_gbps=0.001)
    await m.run("a", prompt(1, 2), 1)
    await m.run("b", prompt(2, 2), 1)
    await m.run("c", prompt(3, 7), 1)  # evicts a's and b's blocks to the host tier
    start = m.clock.now()
    a2, b2 = await asyncio.gather(m.run("a2", prompt(1, 2), 1), m.run("b2", prompt(2, 2), 1))
    load_s = 2 * MockerConfig(**BASE).block_bytes / (0.001 * 1e9)
    assert a2.times[0] - start == pytest.approx(load_s + timing.prefill_ms(1) / 1e3)
    assert b2.times[0] - start == pytest.approx(2 * load_s + timing.prefill_ms(1) / 1e3)
    assert m.engine.scheduler.load_metrics().num_running == 0


async def test_an_aborted_load_frees_its_blocks(make_mocker: Any) -> None:
    m = await make_mocker(**BASE, num_host_blocks=16, host_gbps=0.001)
    await m.run("a", prompt(1, 4), 1)
    await m.run("b", prompt(2, 7), 1)
    stream = m.engine.generate(GenerateRequest("a2", prompt(1, 4), 1))
    await asyncio.sleep(0)
    for _ in range(5):  # until the engine admits it, loading
        if m.engine.scheduler.loading:
            break
        await asyncio.sleep(0)
    assert [s.request_id for s in m.engine.scheduler.loading] == ["a2"]
    await m.engine.abort("a2")
    await stream.aclose()
    m.engine.scheduler.check_invariants()
    assert not m.engine.scheduler.has_work()
    assert m.engine.scheduler.pool.num_active == 0


async def test_tier_events_are_vllm_shaped_and_replay_to_the_tiers(make_mocker: Any) -> None:
    m = await make_mocker(**BASE, num_host_blocks=8)
    for i in range(6):
        await m.run(f"r{i}", prompt(i, 5), 1)
    cpu = [
        e
        for b in m.batches
        for e in b.events
        if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU
    ]
    assert cpu, "evictions offload to the host tier"
    gpu_stored = {
        int(h): e
        for b in m.batches
        for e in b.events
        if isinstance(e, BlockStored) and e.medium == MEDIUM_GPU
        for h in e.block_hashes
    }
    for event in cpu:  # same hash, parent and tokens as when the block entered the GPU
        (h,) = event.block_hashes
        origin = gpu_stored[int(h)]
        i = origin.block_hashes.index(h)
        assert event.token_ids == origin.token_ids[i * BS : (i + 1) * BS]
        expected_parent = origin.block_hashes[i - 1] if i else origin.parent_block_hash
        assert event.parent_block_hash == expected_parent
        assert event.block_size == BS
    held = tier_contents(m.batches)
    assert held[MEDIUM_GPU] == m.engine.cached_block_hashes()
    assert held[MEDIUM_CPU] == set(m.engine.scheduler.tiers.host.lru)
    assert len(held[MEDIUM_CPU]) == 8  # full: its LRU victims were removed with events


async def test_disk_filter_writes_only_reused_blocks(make_mocker: Any) -> None:
    async def run(filtered: bool, decay_s: float = 600.0) -> set[int]:
        m = await make_mocker(
            **BASE,
            num_host_blocks=8,
            num_disk_blocks=64,
            disk_offload_filter=filtered,
            disk_filter_decay_s=decay_s,
        )
        await m.run("hot", prompt(99, 2), 1)
        await m.run("hot2", prompt(99, 2), 1)  # a GPU hit: frequency 1 -> 2
        for i in range(8):  # one-off prompts push everything down the tiers
            await m.run(f"cold{i}", prompt(i, 3), 1)
        return tier_contents(m.batches)[MEDIUM_STORAGE]

    hot = set(sequence_hashes(prompt(99, 2), BS))
    filtered, unfiltered = await run(True), await run(False)
    assert filtered == hot  # only the reused prompt's blocks were worth the disk
    assert unfiltered > hot
    # A reuse long ago (in frequency-decay periods) no longer counts.
    assert await run(True, decay_s=1e-6) == set()


async def test_disk_serves_a_working_set_larger_than_the_host_tier(make_mocker: Any) -> None:
    # Six 3-block prompts in turn: 18 blocks, more than GPU (8) and host (8) hold, so
    # LRU drops each before it comes back and no tier ever hits it. Recomputing a prompt
    # is a reuse all the same: its blocks must reach the disk tier and be served there.
    m = await make_mocker(**BASE, num_host_blocks=8, num_disk_blocks=64)
    for rnd in range(3):
        for i in range(6):
            await m.run(f"r{rnd}-{i}", prompt(i, 3), 1)
    disk = m.engine.scheduler.tiers.disk.stats
    assert disk.offloaded_blocks > 0
    assert disk.hit_blocks >= 3 * 6 // 2  # the third round: most prompts from disk


async def test_full_disk_stops_offload_and_serving_goes_on(
    make_mocker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A block bigger than any free space: the disk path cannot hold even one.
    m = await make_mocker(
        **BASE,
        num_host_blocks=8,
        num_disk_blocks=64,
        disk_offload_filter=False,
        disk_path=str(tmp_path),
        kv_bytes_per_token=2**50,
        host_gbps=1e9,
    )
    with caplog.at_level(logging.WARNING):
        for i in range(8):
            out = await m.run(f"r{i}", prompt(i, 3), 2)
            assert out.finish == "length"
    disk = {s.tier: s for s in m.engine.kv_tier_stats()}[Tier.DISK]
    assert disk.full and disk.used_blocks == 0 and disk.skipped_full_blocks > 0
    assert tier_contents(m.batches)[MEDIUM_STORAGE] == set()
    full_lines = [r for r in caplog.records if "is full" in r.getMessage()]
    assert len(full_lines) == 1 and str(tmp_path) in full_lines[0].getMessage()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_host_blocks": 4}, "num_host_blocks (4) is smaller than num_gpu_blocks (8)"),
        (
            {"num_host_blocks": 16, "num_disk_blocks": 10},
            "num_disk_blocks (10) is smaller than num_host_blocks (16)",
        ),
        ({"num_disk_blocks": 16}, "needs a host tier"),
        ({"num_host_blocks": 16, "host_gbps": 0}, "must be > 0"),
    ],
)
def test_tier_sizes_must_not_shrink_going_down(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MockerConfig(**BASE, **options)


@pytest.mark.parametrize("seed", range(8))
async def test_random_multi_turn_traffic_keeps_tiers_consistent(
    make_mocker: Any, seed: int
) -> None:
    """Conversations that grow and come back, on tiers barely bigger than the GPU: every
    eviction path runs (host hits touched while making room, disk round trips), and the
    events replay to exactly the tiers' contents."""
    rng = random.Random(seed)
    m = await make_mocker(
        **BASE, num_host_blocks=8, num_disk_blocks=12, disk_offload_filter=bool(seed % 2)
    )
    histories: list[list[int]] = [[] for _ in range(5)]
    for turn in range(60):
        user = rng.randrange(len(histories))
        histories[user] += [rng.randrange(50) for _ in range(rng.randrange(1, 2 * BS))]
        history = histories[user][-(6 * BS) :]  # at most what the 8-block pool can run
        out = await m.run(f"t{turn}", history, 2)
        assert out.finish == "length"
        m.engine.scheduler.check_invariants()
    held = tier_contents(m.batches)
    tiers = m.engine.scheduler.tiers
    assert held[MEDIUM_GPU] == m.engine.cached_block_hashes()
    assert held[MEDIUM_CPU] == set(tiers.host.lru)
    assert held[MEDIUM_STORAGE] == set(tiers.disk.lru)


async def test_snapshot_gives_a_late_subscriber_every_tier(make_mocker: Any) -> None:
    """The worker's snapshot state keeps a block per tier: a router that joins late and
    applies the snapshot indexes the same GPU, host and disk blocks as one that followed
    every event (a GPU eviction does not hide the host copy)."""
    m = await make_mocker(**BASE, num_host_blocks=8, num_disk_blocks=16, disk_offload_filter=False)
    for i in range(6):
        await m.run(f"r{i}", prompt(i % 3, 4), 1)
    live, late, state = KvIndex(BS), KvIndex(BS), KvCacheState()
    for index in (live, late):
        index.add_worker("w")
    for batch in m.batches:
        live.apply_batch("w", batch)
        state.apply(batch)
    late.apply_batch("w", state.snapshot())
    for tier in Tier:
        assert late.tier_blocks("w", tier) == live.tier_blocks("w", tier) > 0, tier
    held = tier_contents(m.batches)
    assert state.hashes(MEDIUM_CPU) == held[MEDIUM_CPU]
    assert state.blocks_by_medium() == {k: len(v) for k, v in held.items()}
    for seed in range(3):
        hashes = sequence_hashes(prompt(seed, 4), BS)
        assert late.find_tier_matches(hashes) == live.find_tier_matches(hashes)


async def test_a_full_host_tier_drops_a_prefix_tail_first(make_mocker: Any) -> None:
    """What the tiers keep of a prompt (GPU and host together) is always a prefix of it:
    a block without its parent could never be reached from block 0."""
    m = await make_mocker(**BASE, num_host_blocks=9)
    prompts = [prompt(i, 3 + i % 4) for i in range(10)]
    for i, p in enumerate(prompts):
        await m.run(f"r{i}", p, 1)
        held = set(m.engine.scheduler.tiers.host.lru) | m.engine.cached_block_hashes()
        for q in prompts[: i + 1]:
            kept = [h in held for h in sequence_hashes(q, BS)]
            assert kept == sorted(kept, reverse=True), f"after r{i}: {kept}"
