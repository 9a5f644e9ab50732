"""Block identity: the hashes a router and its workers agree on for a run of tokens.

Every *full* block of ``block_size`` tokens gets a local hash of its content,
``local_i = xxh3_64(LE-u32 token ids of block i, seed=1337)``, and a sequence hash naming
the whole prefix that ends with it, ``seq_0 = local_0``,
``seq_i = xxh3_64(LE-u64 seq_{i-1} ‖ LE-u64 local_i, seed=1337)``. Sequence hashes key
the router's radix tree; a trailing partial block has no identity until it fills.
A LoRA adapter's prompt starts its chain from :func:`adapter_parent` (its name's hash)
instead of nothing, so no block of one adapter is ever another's or the base model's.

This sits on the router's hot path: token ids are packed once with :mod:`array` (one C
loop) and hashed through memoryview slices, with no per-token Python work.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

import xxhash

from dynamoctl.wire.ids import from_bytes, packed

SEED: Final = 1337
"""xxh3 seed for both hash kinds (Dynamo's ``XXH3_SEED``)."""

_xxh3: Final = xxhash.xxh3_64_intdigest
_pack_pair: Final = struct.Struct("<QQ").pack

if array("I").itemsize != 4:  # pragma: no cover - every CPython platform we target has 4
    raise ImportError("dynamoctl.kv.hashing needs a 4-byte array('I')")


class BlockHashes(NamedTuple):
    """Hashes of the full blocks of a token run, one per block, in order."""

    local: list[int]
    """Content hash of each block alone."""
    sequence: list[int]
    """Chained hash of the prefix ending with each block (the block's identity)."""


def adapter_parent(adapter: str | None) -> int | None:
    """The parent hash a prompt's chain starts from under ``adapter`` (None: the base
    model, whose chain starts from nothing)."""
    if adapter is None:
        return None
    return _xxh3(b"lora\0" + adapter.encode(), seed=SEED)


def le_u32(token_ids: Sequence[int]) -> array[int]:
    """``token_ids`` as little-endian u32s (the byte order they are hashed and stored in).

    Raises ``OverflowError`` for a token id outside ``[0, 2**32)``. Ids that already are
    an ``array("I")`` (:data:`~dynamoctl.wire.ids.TokenIds`) are returned as they are,
    not copied: the result is read, never written.
    """
    if sys.byteorder == "big":  # pragma: no cover - the wire order is little-endian
        swapped = array("I", token_ids)
        swapped.byteswap()
        return swapped
    return packed(token_ids)


def from_le_u32(data: bytes) -> list[int]:
    """The token ids of bytes :func:`le_u32` made."""
    return from_bytes(data).tolist()


def local_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Content hash of every full block of ``token_ids``; a partial last block is ignored.

    Raises ``OverflowError`` for a token id outside ``[0, 2**32)``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    full = len(token_ids) - len(token_ids) % block_size
    if full == 0:
        return []
    packed = le_u32(token_ids[:full] if full < len(token_ids) else token_ids)
    view = memoryview(packed).cast("B")
    step = 4 * block_size
    return [_xxh3(view[i : i + step], seed=SEED) for i in range(0, 4 * full, step)]


def chain(local: Iterable[int], parent: int | None = None) -> list[int]:
    """Sequence hashes from local hashes; ``parent`` continues an existing chain."""
    out: list[int] = []
    prev = parent
    for h in local:
        prev = h if prev is None else _xxh3(_pack_pair(prev, h), seed=SEED)
        out.append(prev)
    return out


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> BlockHashes:
    """Local and sequence hashes of the full blocks of ``token_ids``.

    ``parent`` is the sequence hash of the block before ``token_ids[0]`` when hashing a
    continuation (e.g. the blocks a decode fills), None at the start of a sequence.
    """
    local = local_hashes(token_ids, block_size)
    return BlockHashes(local, chain(local, parent))


def sequence_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> list[int]:
    """The sequence hash (block identity) of every full block of ``token_ids``."""
    return chain(local_hashes(token_ids, block_size), parent)
