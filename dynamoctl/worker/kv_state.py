"""What a subscriber must hold after every KV event so far: the worker's snapshot source.

The worker feeds every batch it publishes through :class:`KvCacheState`; a subscriber
that joins late (a restarted router) or lost more events than the replay buffer keeps
gets :meth:`KvCacheState.snapshot` instead: one batch, ``AllBlocksCleared`` followed by a
``BlockStored`` per cached block, that rebuilds the same cache from nothing. Generic over
engines: it only reads the events. A block is kept per tier (``medium``): an offload tier
(docs/mocker.md, "KV tiers") stores and removes its copy independently of the GPU's.
"""

from __future__ import annotations

import time
from collections import Counter

from dynamoctl.kv.hashing import from_le_u32, le_u32
from dynamoctl.wire.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)


def _medium(medium: str | None) -> str:
    return MEDIUM_GPU if medium is None else medium.upper()


class KvCacheState:
    """The cached blocks implied by an event stream, in the order they were stored."""

    def __init__(self) -> None:
        # (hash, medium) -> (parent, tokens as LE u32 bytes, block_size, medium as sent);
        # dict order = store order, so a parent precedes its children when the snapshot
        # replays them. Bytes: an event's ids are packed once and sliced per block (a
        # 32k-token prompt stores ~2000 blocks; an array per block cost ~10x as much).
        self._blocks: dict[
            tuple[ExternalBlockHash, str],
            tuple[ExternalBlockHash | None, bytes, int, str | None],
        ] = {}

    def __len__(self) -> int:
        """Blocks in the GPU prefix cache."""
        return sum(1 for _, medium in self._blocks if medium == MEDIUM_GPU)

    def hashes(self, medium: str = MEDIUM_GPU) -> set[ExternalBlockHash]:
        """Hashes cached in ``medium`` (default: the GPU prefix cache)."""
        want = _medium(medium)
        return {block for block, m in self._blocks if m == want}

    def blocks_by_medium(self) -> dict[str, int]:
        """Blocks held per tier (``GPU``, ``CPU``, ``STORAGE``, ...)."""
        return dict(Counter(medium for _, medium in self._blocks))

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            self._apply(event)

    def _apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            bs = event.block_size
            parent = event.parent_block_hash
            medium = _medium(event.medium)
            packed = le_u32(event.token_ids).tobytes()
            step = 4 * bs
            for i, block in enumerate(event.block_hashes):
                tokens = packed[i * step : (i + 1) * step]
                self._blocks[block, medium] = (parent, tokens, bs, event.medium)
                parent = block
        elif isinstance(event, BlockRemoved):
            medium = _medium(event.medium)
            for block in event.block_hashes:
                self._blocks.pop((block, medium), None)
        else:
            self._blocks.clear()

    def snapshot(self, data_parallel_rank: int | None = None) -> KVEventBatch:
        """One batch that rebuilds this state on an empty (or any) subscriber."""
        events: list[KVEvent] = [AllBlocksCleared()]
        for key in self._parents_first():
            block = key[0]
            parent, tokens, bs, medium = self._blocks[key]
            events.append(
                BlockStored(
                    block_hashes=[block],
                    parent_block_hash=parent,
                    token_ids=from_le_u32(tokens),
                    block_size=bs,
                    medium=medium,
                )
            )
        return KVEventBatch(ts=time.time(), events=events, data_parallel_rank=data_parallel_rank)

    def _parents_first(self) -> list[tuple[ExternalBlockHash, str]]:
        """The blocks in store order, except that a block held in some tier comes before
        its children in any tier (a block offloaded early may have a parent re-stored
        since; the subscriber needs the parent first to know the child)."""
        by_hash: dict[ExternalBlockHash, list[tuple[ExternalBlockHash, str]]] = {}
        for key in self._blocks:
            by_hash.setdefault(key[0], []).append(key)
        order: list[tuple[ExternalBlockHash, str]] = []
        done: set[tuple[ExternalBlockHash, str]] = set()
        for first in self._blocks:
            stack, on_stack = [first], {first}
            while stack:
                key = stack[-1]
                parent = self._blocks[key][0]
                waiting = [
                    k for k in by_hash.get(parent, ()) if k not in done and k not in on_stack
                ] if parent is not None else []  # fmt: skip
                if waiting:
                    stack += waiting
                    on_stack.update(waiting)
                    continue
                stack.pop()
                if key not in done:
                    done.add(key)
                    order.append(key)
        return order
