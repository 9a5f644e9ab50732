"""What a subscriber must hold after every KV event so far: the worker's snapshot source.

The worker feeds every batch it publishes through :class:`KvCacheState`; a subscriber
that joins late (a restarted router) or lost more events than the replay buffer keeps
gets :meth:`KvCacheState.snapshot` instead: one batch, ``AllBlocksCleared`` followed by a
``BlockStored`` per cached block, that rebuilds the same cache from nothing. Generic over
engines: it only reads the events.
"""

from __future__ import annotations

import time
from array import array

from dynamoctl.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)


class KvCacheState:
    """The cached blocks implied by an event stream, in the order they were stored."""

    def __init__(self) -> None:
        # hash -> (parent, tokens, block_size, medium); dict order = store order, so a
        # parent always precedes its children when the snapshot replays them.
        self._blocks: dict[
            ExternalBlockHash, tuple[ExternalBlockHash | None, array[int], int, str | None]
        ] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self) -> set[ExternalBlockHash]:
        return set(self._blocks)

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            self._apply(event)

    def _apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            bs = event.block_size
            parent = event.parent_block_hash
            for i, block in enumerate(event.block_hashes):
                tokens = array("I", event.token_ids[i * bs : (i + 1) * bs])
                self._blocks[block] = (parent, tokens, bs, event.medium)
                parent = block
        elif isinstance(event, BlockRemoved):
            for block in event.block_hashes:
                self._blocks.pop(block, None)
        else:
            self._blocks.clear()

    def snapshot(self, data_parallel_rank: int | None = None) -> KVEventBatch:
        """One batch that rebuilds this state on an empty (or any) subscriber."""
        events: list[KVEvent] = [AllBlocksCleared()]
        for block, (parent, tokens, bs, medium) in self._blocks.items():
            events.append(
                BlockStored(
                    block_hashes=[block],
                    parent_block_hash=parent,
                    token_ids=tokens.tolist(),
                    block_size=bs,
                    medium=medium,
                )
            )
        return KVEventBatch(ts=time.time(), events=events, data_parallel_rank=data_parallel_rank)
