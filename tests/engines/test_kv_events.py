"""KV events: vLLM's positional wire layout out, both vLLM layouts in."""

from __future__ import annotations

import msgspec
import pytest

from dynamoctl.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

BATCH = KVEventBatch(
    ts=12.5,
    events=[
        BlockStored([7, 2**64 - 1], None, [1, 2, 3, 4], 2, medium="GPU"),
        BlockRemoved([7], medium="GPU"),
        AllBlocksCleared(),
    ],
    data_parallel_rank=3,
)


def test_positional_layout_is_vllms() -> None:
    # vllm/distributed/kv_events.py (<= v0.23): array_like structs, tag = class name first.
    assert msgspec.msgpack.decode(encode_batch(BATCH)) == [
        12.5,
        [
            ["BlockStored", [7, 2**64 - 1], None, [1, 2, 3, 4], 2, None, "GPU", None],
            ["BlockRemoved", [7], "GPU"],
            ["AllBlocksCleared"],
        ],
        3,
    ]
    assert decode_batch(encode_batch(BATCH)) == BATCH


def test_decodes_older_and_newer_vllm() -> None:
    old = msgspec.msgpack.encode(  # vLLM 0.8: no medium; later ones append fields we ignore
        [1.0, [["BlockStored", [5], 4, [9, 9], 2, None], ["BlockRemoved", [5], "GPU", 0]]]
    )
    assert decode_batch(old) == KVEventBatch(
        1.0, [BlockStored([5], 4, [9, 9], 2), BlockRemoved([5], "GPU")], None
    )
    new = msgspec.msgpack.encode(  # vLLM after #42892: events are maps tagged by "type"
        [
            12.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [7, 2**64 - 1],
                    "parent_block_hash": None,
                    "token_ids": [1, 2, 3, 4],
                    "block_size": 2,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None, None],
                    "group_idx": 0,
                },
                {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0},
                {"type": "AllBlocksCleared"},
            ],
            3,
        ]
    )
    assert decode_batch(new) == BATCH
    as_map = msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "AllBlocksCleared"}]})
    assert decode_batch(as_map) == KVEventBatch(1.0, [AllBlocksCleared()])
    digest = msgspec.msgpack.encode([1.0, [["BlockRemoved", [b"\x01" * 32], "GPU"]]])
    assert decode_batch(digest).events == [BlockRemoved([b"\x01" * 32], "GPU")]


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x01", msgspec.msgpack.encode([1.0, [["Nope", 1]]]), msgspec.msgpack.encode([1.0])],
)
def test_rejects_garbage(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)
