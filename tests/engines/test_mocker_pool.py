"""BlockPool: reference counts, LRU eviction of cached blocks, and the events it records."""

from __future__ import annotations

import pytest

from dynamoctl.engines.mocker.block_pool import BlockPool
from dynamoctl.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


def store_chain(pool: BlockPool, blocks: list[int], first_hash: int) -> list[int]:
    """Register ``blocks`` as a chain with hashes first_hash, first_hash+1, ..."""
    hashes = [first_hash + i for i in range(len(blocks))]
    pool.store(blocks, hashes, None, [0] * (pool.block_size * len(blocks)))
    return hashes


def test_refcounts_and_free_accounting() -> None:
    pool = BlockPool(4, 2)
    a = pool.allocate(3)
    assert (pool.num_free, pool.num_active) == (1, 3)
    pool.acquire(a[:1])
    pool.release(a)
    assert (pool.num_free, pool.num_active, pool.ref_count(a[0])) == (3, 1, 1)
    pool.release(a[:1])
    assert (pool.num_free, pool.num_active) == (4, 0)
    with pytest.raises(RuntimeError):
        pool.allocate(5)


def test_lru_eviction_emits_removed_for_exactly_the_evicted() -> None:
    pool = BlockPool(6, 2)
    first, second = pool.allocate(3), pool.allocate(3)
    h1 = store_chain(pool, first, 100)
    h2 = store_chain(pool, second, 200)
    assert [type(e) for e in pool.take_events()] == [BlockStored, BlockStored]
    pool.release(first)  # freed first: evicted first, its tail block before its root
    pool.release(second)
    assert pool.cached_hashes() == set(h1 + h2)

    pool.allocate(2)
    assert pool.take_events() == [BlockRemoved([h1[2], h1[1]], medium="GPU")]
    assert pool.cached_hashes() == {h1[0], *h2}
    # A hit taken back out of the free list is safe from eviction.
    hit = pool.match_prefix([h1[0], 999], 2)
    assert hit == [first[0]]
    pool.acquire(hit)
    pool.allocate(3)
    assert pool.take_events() == [BlockRemoved([h2[2], h2[1], h2[0]], medium="GPU")]
    assert pool.cached_hashes() == {h1[0]}


def test_never_used_blocks_go_before_cached_ones() -> None:
    pool = BlockPool(4, 1)
    blocks = pool.allocate(2)
    store_chain(pool, blocks, 1)
    pool.release(blocks)
    assert sorted(pool.allocate(2)) == [2, 3]
    assert pool.take_events()[1:] == []  # only the BlockStored


def test_store_events_carry_chain_and_tokens_and_skip_duplicates() -> None:
    pool = BlockPool(8, 2)
    a, b = pool.allocate(3), pool.allocate(3)
    pool.store(a, [11, 12, 13], 10, [1, 2, 3, 4, 5, 6])
    pool.store(b, [11, 22, 23], 10, [1, 2, 7, 8, 9, 9])  # block 0 duplicates a's
    assert pool.take_events() == [
        BlockStored([11, 12, 13], 10, [1, 2, 3, 4, 5, 6], 2, medium="GPU"),
        BlockStored([22, 23], 11, [7, 8, 9, 9], 2, medium="GPU"),
    ]
    pool.release(b)  # b[0] is a plain block: no hash leaves the cache through it
    pool.release(a)
    pool.allocate(8)
    (removed,) = pool.take_events()
    assert isinstance(removed, BlockRemoved)
    assert sorted(removed.block_hashes) == [11, 12, 13, 22, 23]


def test_reset_only_when_nothing_is_held() -> None:
    pool = BlockPool(2, 1)
    blocks = pool.allocate(1)
    store_chain(pool, blocks, 5)
    pool.take_events()
    assert not pool.reset()
    assert pool.take_events() == []
    pool.release(blocks)
    assert pool.reset()
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.cached_hashes() == set()
    assert pool.match_prefix([5], 1) == []
