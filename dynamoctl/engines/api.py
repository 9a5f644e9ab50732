"""The interface every engine adapter implements, and the types it speaks.

A worker is discovery + request plane + event publisher + one :class:`Engine`. The engine
takes token ids and streams token ids (tokenisation is the frontend's), reports its cache
(KV events) and its load. Request and chunk types are msgspec structs so the worker can put
them on the wire as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from dynamoctl.kv.tiers import TierStats
from dynamoctl.wire.engine import (
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    LoadMetrics,
    ModelCard,
)
from dynamoctl.wire.health import StartupReport
from dynamoctl.wire.kv_events import KVEventBatch

__all__ = [
    "Engine",
    "EngineDied",
    "EngineError",
    "EngineStopped",
    "FinishReason",
    "GenerateChunk",
    "GenerateRequest",
    "HoldsPeerWork",
    "KVEventSink",
    "KvEventSource",
    "KvTransferFailed",
    "LoadMetrics",
    "ModelCard",
    "PeerHandler",
    "PrefillsForRemoteDecode",
    "PublishesKvEvents",
    "ReportsDeath",
    "ReportsKvTiers",
    "RequestRejected",
    "ServesPeers",
]


class EngineError(Exception):
    """Base class for engine failures."""


class RequestRejected(EngineError):
    """The engine cannot serve this request as given (e.g. it needs more KV cache than the
    engine has); retrying it unchanged on the same engine fails again."""


class EngineStopped(EngineError):
    """The engine is not running: never started, stopped, or its loop died (``__cause__``)."""


class EngineDied(EngineStopped):
    """The engine stopped by itself and will not come back (its process died, its loop
    failed): in-flight requests are lost and no new one can start. The worker fails them
    explicitly, deregisters and exits non-zero so that its supervisor restarts it."""


class KvTransferFailed(EngineError):
    """A remotely prefilled request could not get its KV (the prefill worker died, the
    transfer expired or is unknown): the request fails before its first token, and the
    frontend prefills it again (elsewhere or locally)."""


KVEventSink: TypeAlias = Callable[[KVEventBatch], None]
"""Receives each engine step's KV events, in order, synchronously from the engine loop."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine driven by token ids: the adapter every backend implements."""

    @property
    def model_card(self) -> ModelCard:
        """Static facts about the served model and the engine's limits."""
        ...

    async def start(self) -> None:
        """Bring the engine up (load weights, allocate KV cache, start its loop)."""
        ...

    async def stop(self) -> None:
        """Stop; in-flight requests finish with ``abort``. Idempotent."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the request's output; the last chunk has a ``finish_reason``.

        Raises :class:`RequestRejected` (from the iterator) when the request cannot be
        served and :class:`EngineStopped` when the engine is not running.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Cancel a request: its stream ends with ``abort`` and its KV blocks are freed.
        Unknown or finished ids are ignored."""
        ...

    def set_kv_event_sink(self, sink: KVEventSink | None) -> None:
        """Deliver KV events to ``sink`` from now on (set it before :meth:`start` to see
        the stream from the first event). Batches arrive in order; a sink that raises
        stops the engine rather than letting consumers silently diverge."""
        ...

    def load_metrics(self) -> LoadMetrics:
        """Current load; cheap enough to call every step."""
        ...


@dataclass(frozen=True)
class KvEventSource:
    """A KV-event stream an engine publishes itself, in vLLM's framing (see
    :mod:`dynamoctl.planes.events`): what the worker registers for routers to follow."""

    address: str
    """PUB address subscribers connect to, e.g. ``tcp://10.0.0.5:5557``."""
    replay_address: str | None
    """Replay ROUTER address; None: gaps cannot be filled (reported as lost)."""
    topic: str = ""
    """Topic frame of the stream."""
    silent_tiers: Mapping[str, int] = field(default_factory=dict)
    """Offload tiers (by ``medium``) whose evictions the stream never reports (LMCache's
    CPU tier), with their capacity in blocks: subscribers age them out by it."""


@runtime_checkable
class PublishesKvEvents(Protocol):
    """An :class:`Engine` that publishes its KV events on its own sockets (vLLM, SGLang).

    The worker then registers that stream for routers to subscribe to, so they consume
    the engine's events byte for byte, instead of re-publishing them from the sink. The
    worker's own publisher (with snapshots for late subscribers) is used only when
    :meth:`kv_event_source` returns None.
    """

    def set_kv_event_host(self, host: str) -> None:
        """The address the worker binds its sockets on (called before ``start``); the
        engine binds its KV-event sockets there too where it can."""
        ...

    def kv_event_source(self) -> KvEventSource | None:
        """Where the engine publishes, once started; None: it publishes nothing."""
        ...


@runtime_checkable
class ReportsDeath(Protocol):
    """An :class:`Engine` that notices its own death while idle (a watched child process,
    a dead output loop), not only when a request fails.

    Without it the worker learns of a death only from a stream raising
    :class:`EngineStopped`. Either way the adapter must end its open streams (with
    ``abort`` chunks or :class:`EngineStopped`) rather than leave them waiting.
    """

    async def wait_dead(self) -> EngineDied:
        """Return, once the engine has started and then died, the cause. Never returns
        for a :meth:`Engine.stop`; cancelled by the worker when it stops watching."""
        ...


@runtime_checkable
class PrefillsForRemoteDecode(Protocol):
    """An :class:`Engine` that can run a request as a prefill whose KV a decode worker on
    another engine instance takes over (docs/architecture.md). A ``prefill``-role worker needs it.

    The worker runs each request with ``max_tokens=1`` and the engine's own marker merged
    into its ``kv_transfer_params``; the engine returns the hand-off on its chunks
    (:attr:`GenerateChunk.kv_transfer_params`). The frontend never sees the marker, so it
    stays engine-agnostic.
    """

    def remote_prefill_params(self) -> Mapping[str, Any] | None:
        """What a prefill request carries so the engine prefills for a remote decode
        (vLLM: ``{"do_remote_decode": true}``); None: nothing (the engine is configured
        for it already)."""
        ...


PeerHandler: TypeAlias = Callable[[bytes], AsyncIterator[bytes]]
"""A request-plane endpoint: called with the request body, yields response chunks."""


@runtime_checkable
class ServesPeers(Protocol):
    """An :class:`Engine` that serves other workers on the request plane (the mocker's
    ``kv_pull``: decode workers take the KV of its prefills)."""

    def peer_endpoints(self) -> Mapping[str, PeerHandler]:
        """Endpoints the worker registers on its request server, by name."""
        ...

    def set_peer_address(self, address: str) -> None:
        """The worker's request-plane address, once bound (before it registers): where
        peers reach :meth:`peer_endpoints`."""
        ...


@runtime_checkable
class HoldsPeerWork(Protocol):
    """An :class:`Engine` that holds work for peers past its own requests (the mocker's
    pinned prefills, waiting for decode workers to pull them): a draining worker waits,
    within its grace period, until none is left."""

    def pending_peer_work(self) -> int:
        """Hand-offs not yet taken by a peer (0: closing loses nothing)."""
        ...


@runtime_checkable
class ReportsStartup(Protocol):
    """An :class:`Engine` that knows where its start-up stands (the mocker); the worker
    reports it in ``/health`` and ``/metrics`` (docs/metrics.md)."""

    def startup_report(self) -> StartupReport:
        """The current phase, bytes read and seconds so far."""
        ...


@runtime_checkable
class ReportsStalls(Protocol):
    """An :class:`Engine` whose steps are collectives with other processes (a multi-node
    replica's leader): it says how long its current one has waited on another member, so
    a stalled member is seen while the leader itself still answers (docs/operations.md,
    "Wedged instances")."""

    def stalled_for(self) -> float:
        """Seconds its current collective has waited so far; 0 when none is waiting."""
        ...


@runtime_checkable
class ReportsKvTiers(Protocol):
    """An :class:`Engine` that knows its KV tiers' sizes and traffic (the mocker); the
    worker exports them on ``/metrics`` (docs/metrics.md)."""

    def kv_tier_stats(self) -> Sequence[TierStats]:
        """GPU first, then each lower tier it has."""
        ...


class AdapterRefused(EngineError):
    """An adapter could not be loaded (no room, a bad directory, another base model); the
    message says why."""


@runtime_checkable
class ServesAdapters(Protocol):
    """An :class:`Engine` that loads LoRA adapters at run time (docs/api.md, "LoRA
    adapters"); a request's :attr:`GenerateRequest.adapter` names a loaded one."""

    def serves_adapters(self) -> bool:
        """Whether LoRA is on (the engine's arguments enable it); off, the worker follows
        no adapters."""
        ...

    async def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter at ``path`` under ``name`` (done when it returns); raises
        :class:`AdapterRefused`."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Forget ``name`` (nothing happens for one not loaded)."""
        ...
