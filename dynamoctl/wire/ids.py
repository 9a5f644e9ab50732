"""Token ids as they travel: packed unsigned 32-bit integers, little-endian.

A prompt is tens of thousands of ids. As a Python list each one is an object: packing it
for hashing, encoding it as a msgpack array, decoding it again and freeing it each cost
tenths of a millisecond for a 33k-token prompt (benchmarks/token_ids.py). As an
``array("I")`` the same ids are one buffer: copied, hashed and sent as msgpack ``bin``
without touching an id (docs/architecture.md, "Token ids"). :data:`TokenIds` is that
array; engines that want a list (vLLM, SGLang, TensorRT-LLM) get one with :func:`as_list`
at their door.

A struct field typed :data:`TokenIds` is encoded by :func:`enc_hook` as ``bin`` and
decoded by :func:`dec_hook` from ``bin`` (or from a msgpack array of ints, what an
in-process caller that built the struct with a list sends).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    TokenIds: TypeAlias = array[int]
else:
    TokenIds = array
"""Token ids, ``array("I")``."""

_BIG_ENDIAN = sys.byteorder == "big"


def packed(ids: Iterable[int] = ()) -> TokenIds:
    """``ids`` as :data:`TokenIds`: the array itself when it already is one (not a copy),
    else a new one. Raises ``OverflowError`` for an id outside ``[0, 2**32)``."""
    if isinstance(ids, array) and ids.typecode == "I":
        return ids
    return array("I", ids)


def joined(ids: Sequence[int], more: Sequence[int]) -> TokenIds:
    """``ids`` followed by ``more``, as :data:`TokenIds`; ``ids`` itself when ``more`` is
    empty (a prompt is not copied to add nothing)."""
    if not more:
        return packed(ids)
    out = array("I", ids)  # from an array("I"): one copy of its buffer
    out.extend(more)
    return out


def as_list(ids: Sequence[int]) -> list[int]:
    """``ids`` as a list (an engine's API wants one)."""
    if isinstance(ids, array):
        return ids.tolist()
    return ids if isinstance(ids, list) else list(ids)


def to_bytes(ids: TokenIds) -> bytes:
    """The little-endian bytes of ``ids`` (what :func:`enc_hook` sends)."""
    if _BIG_ENDIAN:  # pragma: no cover - the wire order is little-endian
        ids = array("I", ids)
        ids.byteswap()
    return ids.tobytes()


def from_bytes(data: bytes | bytearray | memoryview) -> TokenIds:
    """:data:`TokenIds` of little-endian bytes; a length not a multiple of 4 raises
    ``ValueError``."""
    out = array("I")
    out.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        out.byteswap()
    return out


def enc_hook(obj: Any) -> Any:
    """msgspec's encoder hook: :data:`TokenIds` as ``bin``."""
    if isinstance(obj, array) and obj.typecode == "I":
        return to_bytes(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def dec_hook(kind: type, obj: Any) -> Any:
    """msgspec's decoder hook: :data:`TokenIds` from ``bin`` or from an array of ints."""
    if kind is array:
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return from_bytes(obj)
        if isinstance(obj, list):
            try:
                return array("I", obj)
            except OverflowError as exc:  # msgspec reports ValueError as a ValidationError
                raise ValueError(f"token ids must be in [0, 2**32): {exc}") from None
    raise NotImplementedError(f"cannot decode {kind.__name__} from {type(obj).__name__}")
