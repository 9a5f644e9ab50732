"""The mocker's KV hand-off between a prefill and a decode worker (docs/architecture.md).

A prefill-role mocker keeps a finished prefill's blocks pinned and returns a
:class:`MockerHandoff` (as a plain dict, in :attr:`GenerateChunk.kv_transfer_params`);
the decode mocker calls the prefill worker's ``kv_pull`` request-plane endpoint with a
:class:`KvPullRequest` and gets one :class:`KvPullReply`. Real engines move KV with NIXL
and their own hand-off formats; this is the host-memory/TCP stand-in the mocker speaks.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dynamoctl.wire.records import Endpoint

KV_PULL = Endpoint.KV_PULL
"""Request-plane endpoint a prefill mocker serves: body a KvPullRequest, one KvPullReply."""


class MockerHandoff(msgspec.Struct, frozen=True, kw_only=True):
    """What a prefill mocker's last chunk carries for the decode worker."""

    do_remote_prefill: bool = True
    """Marks the decode request as remotely prefilled (vLLM's key, for symmetry)."""
    remote_address: str
    """Request-plane address of the prefill worker holding the blocks."""
    transfer_id: str
    """Names the pinned blocks on that worker; valid until pulled or expired."""
    num_blocks: int
    """Blocks holding the prompt's KV (the last one may be partial)."""
    block_hashes: list[int]
    """Sequence hashes of the prompt's full blocks: the decode worker checks that the
    hand-off belongs to its prompt."""

    def to_params(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MockerHandoff | None:
        """The hand-off in ``params``; None when they carry none (not remote-prefilled).
        ``ValueError`` when they look like one but are malformed."""
        if "transfer_id" not in params:
            return None
        try:
            return msgspec.convert(params, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"malformed mocker KV hand-off: {exc}") from exc


class KvPullRequest(msgspec.Struct, array_like=True, frozen=True):
    """Take the pinned blocks of one transfer (they are unpinned on the prefill side)."""

    transfer_id: str


class KvPullReply(msgspec.Struct, array_like=True, frozen=True):
    """The blocks a pull took: what the decode worker inserts as computed prompt KV."""

    num_blocks: int
    block_hashes: list[int]
    block_bytes: int
    """Bytes per block on the prefill worker (what the transfer moved, per block)."""


_encoder = msgspec.msgpack.Encoder()
_pull_decoder = msgspec.msgpack.Decoder(KvPullRequest)
_reply_decoder = msgspec.msgpack.Decoder(KvPullReply)


def encode(message: KvPullRequest | KvPullReply) -> bytes:
    return _encoder.encode(message)


def decode_pull(payload: bytes) -> KvPullRequest:
    return _pull_decoder.decode(payload)


def decode_reply(payload: bytes) -> KvPullReply:
    return _reply_decoder.decode(payload)
