"""Block identity (docs/router.md), checked against an independent struct + xxhash computation."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from dynamoctl.kv import hashing


def reference(tokens: list[int], block_size: int) -> tuple[list[int], list[int]]:
    """The block identity of docs/router.md spelled out with struct, one block at a time."""
    local: list[int] = []
    seq: list[int] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        h = xxhash.xxh3_64_intdigest(struct.pack(f"<{block_size}I", *block), seed=1337)
        local.append(h)
        if seq:
            seq.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq[-1], h), seed=1337))
        else:
            seq.append(h)
    return local, seq


def test_pinned_values() -> None:
    tokens = list(range(1, 11))  # two full blocks of 4 and a partial one
    local, seq = hashing.block_hashes(tokens, 4)
    assert (local, seq) == reference(tokens, 4)
    # Pinned literally too, so a change of library or packing shows up as a diff here.
    assert local[0] == xxhash.xxh3_64_intdigest(b"\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\0\0\0", 1337)
    assert seq[0] == local[0]
    assert seq[1] == xxhash.xxh3_64_intdigest(
        local[0].to_bytes(8, "little") + local[1].to_bytes(8, "little"), 1337
    )
    assert hashing.local_hashes([0xFFFFFFFF, 0], 2) == [
        xxhash.xxh3_64_intdigest(b"\xff\xff\xff\xff\0\0\0\0", 1337)
    ]


@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(1, 9))
def test_matches_reference(tokens: list[int], block_size: int) -> None:
    assert hashing.block_hashes(tokens, block_size) == reference(tokens, block_size)


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=60),
    st.lists(st.integers(0, 2**32 - 1), max_size=60),
    st.integers(1, 8),
)
def test_prefix_stable_and_partial_block_ignored(a: list[int], b: list[int], bs: int) -> None:
    whole = hashing.sequence_hashes(a + b, bs)
    assert hashing.sequence_hashes(a, bs) == whole[: len(a) // bs]
    aligned = a[: len(a) - len(a) % bs]
    assert hashing.sequence_hashes(aligned + b[: bs - 1], bs) == hashing.sequence_hashes(
        aligned, bs
    )
    # Continuing a chain from its last hash equals hashing the whole run at once.
    head = hashing.sequence_hashes(aligned, bs)
    tail = hashing.sequence_hashes(b, bs, head[-1] if head else None)
    assert head + tail == hashing.sequence_hashes(aligned + b, bs)


def test_rejects_bad_input() -> None:
    with pytest.raises(OverflowError):
        hashing.local_hashes([2**32], 1)
    with pytest.raises(OverflowError):
        hashing.local_hashes([-1], 1)
    with pytest.raises(ValueError, match="block_size"):
        hashing.local_hashes([1], 0)
    assert hashing.block_hashes([1, 2, 3], 4) == ([], [])
