"""KV cache events in vLLM's publisher format (``vllm/distributed/kv_events.py``).

A payload is a ``KVEventBatch``, msgpack ``[ts, [event, ...], data_parallel_rank]``. Each
event is a struct tagged with its class name. We *encode* the positional form vLLM used
up to v0.23 (``array_like=True``: ``["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, lora_name]``), which our routers take as the wire
format. We *decode* that form and also the map form newer vLLM publishes
(vllm-project/vllm#42892 dropped ``array_like`` from the events: ``{"type":
"BlockStored", "block_hashes": ...}``), so a real worker of either vintage feeds the
router. Trailing fields we do not model (``extra_keys``, ``group_idx``, ...) are ignored.

Block hashes are vLLM's ``ExternalBlockHash`` (``int | bytes``): vLLM sends unsigned
64-bit ints by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), bytes otherwise; the
mocker sends our own sequence hashes (unsigned u64, :mod:`dynamoctl.kv.hashing`).
"""

from __future__ import annotations

from typing import Final, TypeAlias

import msgspec

ExternalBlockHash: TypeAlias = int | bytes
"""An engine's name for a block: an unsigned 64-bit int, or raw digest bytes."""

MEDIUM_GPU: Final = "GPU"
"""``medium`` of blocks in device memory (vLLM's ``MEDIUM_GPU``)."""
MEDIUM_CPU: Final = "CPU"
"""``medium`` of blocks offloaded to host memory (vLLM's ``MEDIUM_CPU``; LMCache outside
its multi-process mode writes it in lower case, which readers accept)."""
MEDIUM_STORAGE: Final = "STORAGE"
"""``medium`` of blocks offloaded to disk or a shared store (vLLM's ``MEDIUM_STORAGE``)."""


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the events; the tag is the class name."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache: a chain, each block the parent of the next."""

    block_hashes: list[ExternalBlockHash]
    """Engine hashes of the new blocks, in sequence order."""
    parent_block_hash: ExternalBlockHash | None
    """Engine hash of the block before the first one; None at the start of a sequence."""
    token_ids: list[int]
    """The blocks' tokens, concatenated (``block_size`` per block)."""
    block_size: int
    """Tokens per block."""
    lora_id: int | None = None
    """LoRA adapter id (vLLM deprecates it for ``lora_name``); None: base model."""
    medium: str | None = None
    """Where the blocks live (``GPU``, ``CPU``, ...); None from vLLM before 0.9."""
    lora_name: str | None = None
    """LoRA adapter name (vLLM >= 0.11); None: base model."""


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache (evicted); no longer a cache hit."""

    block_hashes: list[ExternalBlockHash]
    """Engine hashes of the removed blocks."""
    medium: str | None = None
    """Tier the blocks were removed from; see :attr:`BlockStored.medium`."""


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was dropped (a reset)."""


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The events of one engine step, in the order they happened."""

    ts: float
    """Wall-clock time the batch was made (``time.time()``), as vLLM stamps it."""
    events: list[KVEvent]
    """Events in order; applying them in order reproduces the engine's cache."""
    data_parallel_rank: int | None = None
    """The engine's data-parallel rank; None outside data parallelism."""


# --------------------------------------------------------------------------- map form
# vLLM after #42892: same names and fields, each event a map with its tag under "type".


class _MapEvent(msgspec.Struct, gc=False, tag=True):
    pass


class _MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None = None


class _MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


_MapKVEvent: TypeAlias = _MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _RawMapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


def _from_map(event: _MapKVEvent) -> KVEvent:
    if isinstance(event, _MapBlockStored):
        return BlockStored(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
        )
    if isinstance(event, _MapBlockRemoved):
        return BlockRemoved(event.block_hashes, event.medium)
    return AllBlocksCleared()


# --------------------------------------------------------------------------- codecs

_encoder: Final = msgspec.msgpack.Encoder()
_batch_decoder: Final = msgspec.msgpack.Decoder(KVEventBatch)
_raw_decoder: Final = msgspec.msgpack.Decoder(_RawBatch)
_raw_map_decoder: Final = msgspec.msgpack.Decoder(_RawMapBatch)
_event_decoder: Final[msgspec.msgpack.Decoder[KVEvent]] = msgspec.msgpack.Decoder(KVEvent)
_map_event_decoder: Final[msgspec.msgpack.Decoder[_MapKVEvent]] = msgspec.msgpack.Decoder(
    _MapKVEvent
)

DecodeError = msgspec.DecodeError


def _is_map(buf: bytes | memoryview) -> bool:
    """Whether a msgpack value is a map (fixmap 0x80-0x8f, map16 0xde, map32 0xdf)."""
    first = buf[0]
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def encode_batch(batch: KVEventBatch) -> bytes:
    """msgpack payload of ``batch`` in vLLM's positional form."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload from any vLLM vintage (positional or map events); raises
    :data:`DecodeError` on anything else."""
    try:
        return _batch_decoder.decode(payload)  # our own and vLLM <= 0.23: the fast path
    except msgspec.DecodeError:
        if not payload:
            raise
    raw = _raw_map_decoder.decode(payload) if _is_map(payload) else _raw_decoder.decode(payload)
    events: list[KVEvent] = []
    for item in raw.events:
        if _is_map(memoryview(item)):
            events.append(_from_map(_map_event_decoder.decode(item)))
        else:
            events.append(_event_decoder.decode(item))
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank)
