"""Booked blocks as chains (dynamoctl/router/load.py, BookedChains) count and match what a
block-by-block reference count does, whatever is booked and released in whatever order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.router.index import PrefixIndex
from dynamoctl.router.load import BookedChains

WORKERS = ["a", "b", "c"]
# Prompts over a small alphabet of blocks: many share leading blocks, some are equal.
prompts = st.lists(st.integers(0, 2), min_size=0, max_size=12).map(
    lambda blocks: sequence_hashes([t for b in blocks for t in (b, b)], 2)
)
operations = st.lists(
    st.tuples(st.sampled_from(["book", "release"]), st.sampled_from(WORKERS), prompts),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.lists(prompts, min_size=1, max_size=5))
def test_chains_count_and_match_as_blocks_do(
    ops: list[tuple[str, str, list[int]]], queries: list[list[int]]
) -> None:
    chains, reference = BookedChains(), PrefixIndex()
    held: dict[str, list[list[int]]] = {w: [] for w in WORKERS}
    for w in WORKERS:
        chains.add_worker(w)
        reference.add_worker(w)
    for op, worker, hashes in ops:
        if op == "book":
            chains.add(worker, hashes)
            reference.add(worker, hashes)
            held[worker].append(hashes)
        elif hashes in held[worker]:  # release only what was booked, as ActiveLoad does
            held[worker].remove(hashes)
            chains.discard(worker, hashes)
            reference.discard(worker, hashes)
        else:
            chains.discard(worker, hashes)  # unknown: ignored
    for w in WORKERS:
        assert chains.blocks(w) == reference.tree_size(w)
    for hashes in queries:
        assert chains.overlaps(hashes) == reference.find_matches(hashes)


def test_a_removed_worker_counts_nothing_and_matches_nothing() -> None:
    chains = BookedChains()
    chains.add_worker("a")
    prompt = sequence_hashes(list(range(64)), 16)
    chains.add("a", prompt)
    chains.add("a", prompt[:2])
    assert chains.blocks("a") == 4 and chains.overlaps(prompt) == {"a": 4}
    chains.remove_worker("a")
    assert chains.blocks("a") == 0 and chains.overlaps(prompt) == {}
