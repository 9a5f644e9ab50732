"""Token ids on the wire (dynamoctl/wire/ids.py): packed u32s, little-endian, as msgpack
``bin``; a list sent by an in-process caller decodes the same; bad ids are refused."""

from __future__ import annotations

from array import array

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.ids import as_list, from_bytes, joined, packed, to_bytes
from dynamoctl.wire.router import RouteRequest

ids_st = st.lists(st.integers(0, 2**32 - 1), max_size=300)


@given(ids_st, st.booleans())
def test_a_request_decodes_to_the_ids_sent_packed_or_as_a_list(
    ids: list[int], as_array: bool
) -> None:
    sent = packed(ids) if as_array else ids
    body = wire_engine.encode(GenerateRequest("r", sent, 4))  # type: ignore[arg-type]
    got = wire_engine.decode_request(body)
    assert isinstance(got.token_ids, array) and got.token_ids.tolist() == ids
    route = wire_router.decode_call(wire_router.encode(RouteRequest("m", "r", sent)))  # type: ignore[arg-type]
    assert isinstance(route, RouteRequest) and route.token_ids.tolist() == ids


def test_packed_ids_travel_as_little_endian_bin() -> None:
    body = wire_engine.encode(GenerateRequest("r", packed([1, 256, 2**32 - 1]), 4))
    fields = msgspec.msgpack.decode(body)
    assert fields[1] == b"\x01\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff"


@pytest.mark.parametrize(
    "bad",
    [[-1], [2**32], [1.5], ["7"], b"\x01\x02\x03"],
    ids=["negative", "too-big", "float", "string", "ragged-bin"],
)
def test_bad_ids_are_a_validation_error(bad: object) -> None:
    body = msgspec.msgpack.encode(["r", bad, 4])
    with pytest.raises(msgspec.ValidationError):
        wire_engine.decode_request(body)


def test_helpers_copy_only_when_they_must() -> None:
    ids = packed([5, 6, 7])
    assert packed(ids) is ids
    assert joined(ids, []) is ids
    more = joined(ids, [8])
    assert more.tolist() == [5, 6, 7, 8] and ids.tolist() == [5, 6, 7]
    assert joined([1], packed([2])).tolist() == [1, 2]
    assert as_list(ids) == [5, 6, 7] and as_list([1]) == [1]
    assert from_bytes(to_bytes(ids)) == ids
