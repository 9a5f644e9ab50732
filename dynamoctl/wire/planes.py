"""Wire schema of the request and event planes (see ``dynamoctl.wire`` for the rest).

Messages are ``msgspec`` structs encoded with msgpack as arrays (``array_like=True``): a
message is ``[tag, field, field, ...]`` with a small integer tag first, so the decoder picks
the type from a tagged union without field names on the wire. Compatibility rule: append new
fields at the end, with a default. A shorter array decodes with the defaults and a longer
one's extra elements are ignored, so old and new peers interoperate. (``omit_defaults`` is
set as in vLLM's structs, but msgspec still writes every field of an array-like struct:
jcrist/msgspec#720.) ``gc=False``: the structs hold no reference cycles, and skipping the
garbage collector matters at tens of thousands of messages per second.

Sections:

* **Request plane** (``dynamoctl.planes.request``): client → server ``Request``, ``Credit``,
  ``Cancel``, ``Ping``; server → client ``Chunk``, ``End``, ``Error``, ``Pong``. Tags 1-15
  are client messages, 16-31 server messages. Each ZMQ message carries exactly one encoded
  struct (the ROUTER adds the peer identity frame in front on the server side).
* **Event plane** (``dynamoctl.planes.events``): raw frames, wire-compatible with vLLM's
  ``ZmqEventPublisher``; only the frame helpers live here. Payloads are in
  :mod:`dynamoctl.wire.kv_events` and :mod:`dynamoctl.wire.engine`.

Tags from 32 up are free for later messages (control plane).
"""

from __future__ import annotations

import enum
from typing import Final, TypeAlias

import msgspec

# --------------------------------------------------------------------------- base


class WireMessage(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag_field="t"):
    """Base of every tagged message; subclasses set ``tag=<small int>``."""


# --------------------------------------------------------------------------- request plane


class ErrorCode(enum.IntEnum):
    """Why a stream ended with :class:`Error` instead of :class:`End`."""

    HANDLER = 1
    """The endpoint's handler raised; ``message`` carries ``Type: text``."""
    UNKNOWN_ENDPOINT = 2
    """No handler registered under that name; ``message`` lists the known ones."""
    OVERLOADED = 3
    """The server is at its in-flight bound (``max_inflight``); try another worker."""
    UNKNOWN_STREAM = 4
    """A Credit named a request id the server does not know: the Request was lost in
    transit or the server restarted. The client fails the stream as a dead peer."""
    BAD_REQUEST = 5
    """Malformed request: duplicate request id, window < 1."""


class Request(WireMessage, tag=1):
    """Open stream ``rid`` on ``endpoint``; the server may send ``window`` chunks before
    it needs a :class:`Credit`."""

    rid: int
    endpoint: str
    body: bytes
    window: int


class Credit(WireMessage, tag=2):
    """The client has room for chunks up to sequence number ``limit`` (exclusive).

    Cumulative rather than incremental so that a lost or repeated Credit is harmless: the
    client re-sends it as a probe on streams that have been quiet for a heartbeat interval.
    """

    rid: int
    limit: int


class Cancel(WireMessage, tag=3):
    """The consumer went away: cancel the handler of ``rid``."""

    rid: int


class Ping(WireMessage, tag=4):
    """Client heartbeat; the server answers :class:`Pong` and refreshes the client's
    liveness."""


class Chunk(WireMessage, tag=16):
    """One item yielded by the handler; ``seq`` counts from 0 per stream so that a chunk
    lost in transit (a TCP reconnect drops queued messages) is detected, not skipped."""

    rid: int
    seq: int
    data: bytes


class End(WireMessage, tag=17):
    """The handler returned; no more chunks for ``rid``."""

    rid: int


class Error(WireMessage, tag=18):
    """Stream ``rid`` failed; see :class:`ErrorCode`."""

    rid: int
    code: ErrorCode
    message: str = ""


class Pong(WireMessage, tag=19):
    """Server heartbeat answer."""


SERVER_HEARTBEAT_TIMEOUT: Final = 3.0
"""Seconds of a client's silence after which a request-plane server cancels its streams
(its default): a client pings more often than this, whatever its own timeout."""

ClientMessage: TypeAlias = Request | Credit | Cancel | Ping
ServerMessage: TypeAlias = Chunk | End | Error | Pong

# --------------------------------------------------------------------------- event plane
#
# PUB:    [topic, seq (8 bytes, big-endian unsigned), payload]
# replay: DEALER sends [b"", start seq (8 bytes BE)]; the ROUTER answers, per entry,
#         [b"", seq, payload], optionally one [b"", seq, snapshot, SNAPSHOT_MARKER] first
#         (our extension; that seq is signed, -1 = before any event), and finally
#         [b"", END_SEQ, b""].

END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
"""End-of-replay marker in the seq frame (vLLM's ``ZmqEventPublisher.END_SEQ``)."""
SNAPSHOT_MARKER: Final = b"snapshot"
"""Third frame of a replay reply that carries a full snapshot (dynamoctl extension)."""


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def seq_from_bytes(frame: bytes) -> int:
    return int.from_bytes(frame, "big")


def snapshot_seq_to_bytes(seq: int) -> bytes:
    """A snapshot's seq is signed: -1 is the state before any event."""
    return seq.to_bytes(8, "big", signed=True)


def snapshot_seq_from_bytes(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


# --------------------------------------------------------------------------- codecs
#
# Module-level singletons: building an Encoder/Decoder costs far more than one message.

_encoder: Final = msgspec.msgpack.Encoder()
_client_decoder: Final[msgspec.msgpack.Decoder[ClientMessage]] = msgspec.msgpack.Decoder(
    ClientMessage
)
_server_decoder: Final[msgspec.msgpack.Decoder[ServerMessage]] = msgspec.msgpack.Decoder(
    ServerMessage
)

DecodeError = msgspec.DecodeError


def encode(msg: WireMessage) -> bytes:
    return _encoder.encode(msg)


def decode_client(buf: bytes) -> ClientMessage:
    """Decode a client → server request-plane message; raises :data:`DecodeError`."""
    return _client_decoder.decode(buf)


def decode_server(buf: bytes) -> ServerMessage:
    """Decode a server → client request-plane message; raises :data:`DecodeError`."""
    return _server_decoder.decode(buf)
