"""The wire schema: every message and record dynamoctl puts on a socket or in discovery.

One package, one module per plane, all msgspec structs:

* :mod:`~dynamoctl.wire.planes` — request-plane messages (tagged msgpack arrays) and the
  event-plane frame helpers. Re-exported here: ``wire.Request``, ``wire.encode``, ...
* :mod:`~dynamoctl.wire.kv_events` — KV cache events in vLLM's own format, so that real
  vLLM/SGLang workers and the mocker feed the router the same bytes.
* :mod:`~dynamoctl.wire.engine` — engine payloads: ``GenerateRequest``/``GenerateChunk`` on
  the ``generate`` endpoint, ``LoadMetrics`` on the load stream, ``ModelCard`` in discovery.
* :mod:`~dynamoctl.wire.kv_transfer` — the mocker's KV hand-off and its ``kv_pull`` endpoint.
* :mod:`~dynamoctl.wire.router` — the standalone router's ``route`` endpoint and the
  bookings stream its replicas share.
* :mod:`~dynamoctl.wire.records` — JSON discovery records (instances, event addresses).
"""

from dynamoctl.wire import engine, kv_events, kv_transfer, records, router
from dynamoctl.wire.planes import (
    END_SEQ,
    SERVER_HEARTBEAT_TIMEOUT,
    SNAPSHOT_MARKER,
    Cancel,
    Chunk,
    ClientMessage,
    Credit,
    DecodeError,
    End,
    Error,
    ErrorCode,
    Ping,
    Pong,
    Request,
    ServerMessage,
    WireMessage,
    decode_client,
    decode_server,
    encode,
    seq_from_bytes,
    seq_to_bytes,
    snapshot_seq_from_bytes,
    snapshot_seq_to_bytes,
)
from dynamoctl.wire.records import EventsRecord, InstanceRecord, decode_json, encode_json

__all__ = [
    "END_SEQ",
    "SERVER_HEARTBEAT_TIMEOUT",
    "SNAPSHOT_MARKER",
    "Cancel",
    "Chunk",
    "ClientMessage",
    "Credit",
    "DecodeError",
    "End",
    "Error",
    "ErrorCode",
    "EventsRecord",
    "InstanceRecord",
    "Ping",
    "Pong",
    "Request",
    "ServerMessage",
    "WireMessage",
    "decode_client",
    "decode_json",
    "decode_server",
    "encode",
    "encode_json",
    "engine",
    "kv_events",
    "kv_transfer",
    "records",
    "router",
    "seq_from_bytes",
    "seq_to_bytes",
    "snapshot_seq_from_bytes",
    "snapshot_seq_to_bytes",
]
