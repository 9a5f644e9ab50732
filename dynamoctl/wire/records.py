"""Discovery records: the values stored under the keys of ``dynamoctl.discovery.keys``.

JSON (not msgpack) so that an operator reading ``dynamoctl discovery ls`` or ``etcdctl get``
sees them as they are. Unknown fields are ignored when decoding, so a newer writer's
records still decode in an older reader.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from dynamoctl.wire.words import Word


class Component(Word):
    """What a process is, in discovery keys and records (``{ns}/instances/{component}/...``)."""

    WORKER = "worker"
    FRONTEND = "frontend"
    ROUTER = "router"
    SUPERVISOR = "supervisor"
    PLANNER = "planner"
    STANDBY = "standby"
    """A warm spare worker: its record (``{ns}/instances/standby/generate/{id}``) says it
    runs and where its ``/health`` is; routers and planners watch ``worker`` only, so it is
    never picked. Promoted, it registers as a worker and drops this record."""


class Endpoint(Word):
    """What an instance serves at its record's ``address``: the contract between the
    process that registers it and the ones that call it."""

    GENERATE = "generate"
    """A worker's request plane: ``GenerateRequest`` in, ``GenerateChunk`` stream out."""
    KV_PULL = "kv_pull"
    """A prefill mocker's pinned KV hand-offs (``dynamoctl.wire.kv_transfer``)."""
    ROUTE = "route"
    """A standalone router: ``RouteRequest``/``RouteNotify`` in (``dynamoctl.wire.router``)."""
    HTTP = "http"
    """The frontend's OpenAI API (an HTTP base URL, not a request plane)."""
    CONTROL = "control"
    """The supervisor's control endpoint (HTTP)."""
    PLAN = "plan"
    """The SLA planner: its ``/health`` answers :class:`dynamoctl.wire.planner.PlannerStatus`
    (it serves no requests; the record says it runs and where)."""


class InstanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/instances/{component}/{endpoint}/{instance_id}``: a serving instance."""

    instance_id: str
    """Unique id of the instance (host, pid and index for workers)."""
    component: str
    """``worker``, ``frontend``, ``router``."""
    endpoint: str
    """Request-plane endpoint name served at ``address`` (``generate`` for workers)."""
    address: str
    """Request-plane address to connect to, e.g. ``tcp://10.0.0.5:41234``."""
    host: str
    """Host name the instance runs on."""
    pid: int
    """Process id on ``host``."""
    role: str = ""
    """Worker role: ``agg``, ``prefill`` or ``decode``."""
    model: str = ""
    """Served model name."""
    metrics_url: str | None = None
    """Prometheus endpoint of the instance's process."""
    health_url: str | None = None
    """``/health`` of the instance's process: 200 while it serves (a worker's answers
    :class:`dynamoctl.wire.health.WorkerHealth`)."""
    label: str = ""
    """The supervisor's name for the process (``agg-0``), empty when started by hand."""
    adapters: list[str] = []
    """LoRA adapters loaded on the instance, by served name: routers of those names route
    to it too (docs/api.md, "LoRA adapters")."""


class EventsRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/events/{component}/{instance_id}``: where an instance publishes its streams."""

    kv: str
    """PUB address of the KV-event stream (vLLM framing)."""
    kv_replay: str | None
    """Replay ROUTER of the KV-event stream."""
    kv_topic: str
    """Topic frame of KV events."""
    load: str
    """PUB address of the load-metrics stream (:class:`~dynamoctl.wire.engine.LoadMetrics`)."""
    load_replay: str | None
    """Replay ROUTER of the load stream."""
    load_topic: str
    """Topic frame of load metrics."""
    kv_curve: bool = True
    """Whether the KV stream speaks CURVE when the deployment has a key (false: an engine's
    own publisher, which cannot; docs/security.md)."""
    silent_tiers: dict[str, int] = {}
    """Offload tiers (by KV-event ``medium``) whose evictions the KV stream never reports
    (LMCache's CPU tier), with their capacity in blocks: routers forget the oldest blocks
    past it (docs/router.md, "Tiers")."""


class BookingsRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/events/router/{instance_id}``: where a router replica publishes its bookings
    (:mod:`dynamoctl.wire.router`), for the other replicas to apply."""

    bookings: str
    """PUB address of the bookings stream."""
    bookings_replay: str | None
    """Replay ROUTER of the bookings stream (answers with a snapshot when needed)."""
    topic: str
    """Topic frame of the stream."""


Record = TypeVar("Record", bound=msgspec.Struct)


def encode_json(record: msgspec.Struct) -> bytes:
    return msgspec.json.encode(record)


def decode_json(payload: bytes, type: type[Record]) -> Record:
    """Decode a record; raises ``msgspec.DecodeError`` naming the bad field."""
    return msgspec.json.decode(payload, type=type)
