"""TensorRT-LLM's KV-cache events (``LLM.get_kv_cache_events_async``) in vLLM's format.

TensorRT-LLM hands out one dict per event (``KVCacheEventSerializer``): ``{"event_id": n,
"data": {...}, "window_size": w}`` with ``data`` one of

* ``{"type": "stored", "parent_hash": h | None, "blocks": [{"type": "stored_block",
  "block_hash": h, "tokens": [{"type": "unique_token", "token_id": t, ...}], "lora_id":
  l | None, "cache_level": c, ...}]}``
* ``{"type": "removed", "block_hashes": [h, ...]}``
* ``{"type": "created", ...}`` and ``{"type": "updated", ...}``: no change to which blocks
  are cached, ignored.

``cache_level`` 0 is device memory (``GPU``), higher levels the host offload tier
(``CPU``): the router only counts the first. A stored block with fewer tokens than a
block ends its chain there (the rest could not be hashed as the router does).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from dynamoctl.wire.kv_events import (
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)


def _medium(level: Any) -> str:
    return MEDIUM_GPU if not level else "CPU"


def convert_event(event: Mapping[str, Any], block_size: int) -> KVEvent | None:
    """One TensorRT-LLM event as ours; None for events that change nothing we track."""
    data = event.get("data", {})
    kind = data.get("type")
    if kind == "removed":
        return BlockRemoved(block_hashes=list(data.get("block_hashes", [])), medium=None)
    if kind != "stored":
        return None
    hashes: list[int] = []
    tokens: list[int] = []
    lora: int | None = None
    medium = MEDIUM_GPU
    for block in data.get("blocks", []):
        ids = [int(t["token_id"]) for t in block.get("tokens", [])]
        if len(ids) != block_size:
            break
        hashes.append(int(block["block_hash"]))
        tokens += ids
        lora = block.get("lora_id") or lora
        medium = _medium(block.get("cache_level"))
    if not hashes:
        return None
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=data.get("parent_hash"),
        token_ids=tokens,
        block_size=block_size,
        lora_id=lora,
        medium=medium,
    )


def convert_events(
    events: Iterable[Mapping[str, Any]], block_size: int, dp_rank: int | None = None
) -> KVEventBatch | None:
    """A batch of TensorRT-LLM events, in order, as one of ours; None if nothing changed."""
    out = [e for e in (convert_event(event, block_size) for event in events) if e is not None]
    return KVEventBatch(time.time(), out, dp_rank) if out else None
