"""The wire schema: tags are small and stable, every message round-trips."""

from __future__ import annotations

import msgspec
import pytest

from dynamoctl import wire

CLIENT = [
    wire.Request(7, "generate", b"\x00body", 64),
    wire.Credit(7, 96),
    wire.Cancel(7),
    wire.Ping(),
]
SERVER = [
    wire.Chunk(7, 0, b"tok"),
    wire.End(7),
    wire.Error(7, wire.ErrorCode.OVERLOADED, "busy"),
    wire.Pong(),
]


@pytest.mark.parametrize("msg", CLIENT, ids=lambda m: type(m).__name__)
def test_client_messages_round_trip(msg: wire.ClientMessage) -> None:
    assert wire.decode_client(wire.encode(msg)) == msg


@pytest.mark.parametrize("msg", SERVER, ids=lambda m: type(m).__name__)
def test_server_messages_round_trip(msg: wire.ServerMessage) -> None:
    assert wire.decode_server(wire.encode(msg)) == msg


def test_messages_are_arrays_with_a_small_tag_first() -> None:
    assert msgspec.msgpack.decode(wire.encode(wire.Chunk(3, 1, b"x"))) == [16, 3, 1, b"x"]
    assert msgspec.msgpack.decode(wire.encode(wire.Ping())) == [4]


def test_a_field_appended_later_keeps_old_peers_decoding() -> None:
    # An old peer's shorter array decodes with the default of the appended field.
    old = msgspec.msgpack.encode([18, 3, 1])
    assert wire.decode_server(old) == wire.Error(3, wire.ErrorCode.HANDLER, "")
    # A newer peer's longer array decodes here with the extra element ignored.
    new = msgspec.msgpack.encode([17, 3, "field from the future"])
    assert wire.decode_server(new) == wire.End(3)


def test_a_server_message_is_not_a_client_message() -> None:
    with pytest.raises(wire.DecodeError):
        wire.decode_client(wire.encode(wire.Pong()))


def test_event_plane_frames_match_vllm() -> None:
    # vLLM: seq.to_bytes(8, "big"); END_SEQ = (-1).to_bytes(8, "big", signed=True)
    assert wire.seq_to_bytes(1) == b"\x00" * 7 + b"\x01"
    assert wire.END_SEQ == b"\xff" * 8
    assert wire.seq_from_bytes(wire.seq_to_bytes(2**40)) == 2**40
    assert wire.snapshot_seq_from_bytes(wire.snapshot_seq_to_bytes(-1)) == -1
