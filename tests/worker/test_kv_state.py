"""The worker's snapshot rebuilds exactly the cache its event stream implies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.engines.mocker.clock import VirtualClock
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.engine import MockerEngine
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.kv_events import KVEventBatch, decode_batch, encode_batch
from dynamoctl.worker.kv_state import KvCacheState


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=40), min_size=1, max_size=25)
)
async def test_snapshot_reproduces_engine_cache(prompts: list[list[int]]) -> None:
    """Random prompts on a tiny pool (evictions happen); after every request, a fresh
    state fed only the snapshot's bytes equals the engine's own cached-block set."""
    engine = MockerEngine(
        MockerConfig(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=64),
        clock=VirtualClock(),
    )
    state = KvCacheState()
    engine.set_kv_event_sink(lambda batch: state.apply(decode_batch(encode_batch(batch))))
    await engine.start()
    try:
        for i, tokens in enumerate(prompts):
            request = GenerateRequest(f"r{i}", tokens, max_tokens=3, ignore_eos=True)
            async for _ in engine.generate(request):
                pass
            rebuilt = KvCacheState()
            rebuilt.apply(decode_batch(encode_batch(state.snapshot())))
            assert rebuilt.hashes() == state.hashes() == engine.cached_block_hashes()
    finally:
        await engine.stop()


def test_snapshot_starts_with_clear_and_keeps_parents_first() -> None:
    from dynamoctl.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    state = KvCacheState()
    state.apply(
        KVEventBatch(
            ts=0.0,
            events=[
                BlockStored([1, 2, 3], None, list(range(12)), 4),
                BlockRemoved([2]),
                BlockStored([9], 3, [7, 7, 7, 7], 4),
            ],
        )
    )
    snap = state.snapshot().events
    assert isinstance(snap[0], AllBlocksCleared)
    stored = [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in snap[1:]]
    assert stored == [([1], None, [0, 1, 2, 3]), ([3], 2, [8, 9, 10, 11]), ([9], 3, [7] * 4)]
