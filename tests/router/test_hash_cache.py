"""The router's block-hash cache: a conversation's next turn hashes only its new blocks,
and every answer equals a fresh hash of the whole prompt."""

from __future__ import annotations

import random

from dynamoctl.kv.hash_cache import MIN_BLOCKS, HashCache
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.router.router import KvRouter

BS = 16


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(150_000) for _ in range(n)]


def test_turns_of_a_conversation_equal_a_fresh_hash_and_reuse_the_previous_turn() -> None:
    rng = random.Random(7)
    cache = HashCache(BS)
    prompt = _ids(rng, 32_000 + 5)  # a partial last block, cut off by the next turn
    for turn in range(6):
        assert cache.sequence_hashes(prompt) == sequence_hashes(prompt, BS)
        assert cache.hits == turn
        prompt = prompt + _ids(rng, 403)
    # each turn reused every full block of the one before it
    assert cache.reused_blocks == sum((32_005 + 403 * t) // BS for t in range(5))


def test_a_prompt_that_differs_inside_a_cached_run_is_hashed_afresh() -> None:
    rng = random.Random(8)
    cache = HashCache(BS)
    first = _ids(rng, BS * (MIN_BLOCKS + 40))
    cache.sequence_hashes(first)
    changed = list(first)
    changed[BS * 50 + 3] += 1  # same first block (same lookup key), different history
    changed += _ids(rng, 200)
    assert cache.sequence_hashes(changed) == sequence_hashes(changed, BS)
    assert cache.hits == 0
    shorter = first[: BS * (MIN_BLOCKS + 10)]  # a prefix of the cached run: not an extension
    assert cache.sequence_hashes(shorter) == sequence_hashes(shorter, BS)


def test_conversations_sharing_a_first_block_each_extend_their_own() -> None:
    rng = random.Random(9)
    cache = HashCache(BS)
    system = _ids(rng, BS * 8)
    chats = [system + _ids(rng, BS * MIN_BLOCKS) for _ in range(3)]
    for _ in range(3):
        chats = [c + _ids(rng, 300) for c in chats]
        for chat in chats:
            assert cache.sequence_hashes(chat) == sequence_hashes(chat, BS)
    assert cache.hits == 6  # the second and third rounds, every chat


def test_the_cache_stays_within_its_block_budget() -> None:
    rng = random.Random(10)
    cache = HashCache(BS, max_blocks=4 * (MIN_BLOCKS + 10))
    for _ in range(20):
        prompt = _ids(rng, BS * (MIN_BLOCKS + 10))
        assert cache.sequence_hashes(prompt) == sequence_hashes(prompt, BS)
        assert cache._blocks <= cache.max_blocks
    assert len(cache._runs) == 4
    assert sum(len(keys) for keys in cache._by_head.values()) == 4


def test_the_router_books_the_same_blocks_with_the_cache() -> None:
    rng = random.Random(11)
    router = KvRouter("kv", BS, seed=1)
    router.add_worker("w0")
    prompt = _ids(rng, 4000)
    for turn in range(3):
        decision = router.pick(prompt, f"r{turn}")
        assert decision.prompt_blocks == len(prompt) // BS
        booked = router.load._bookings[f"r{turn}"].hashes
        assert list(booked) == sequence_hashes(prompt, BS)
        prompt = prompt + _ids(rng, 250)
    assert router.hashes.hits == 2
