"""What every long-running component (worker, frontend, router) is told, once."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from dynamoctl.settings.base import Options
from dynamoctl.settings.model_cache import ModelCacheSettings
from dynamoctl.settings.parsers import OutputParserSettings
from dynamoctl.settings.tracing import TracingSettings
from dynamoctl.wire.roles import Role as Role  # re-exported: the settings name it


class ComponentSettings(Options):
    """The flags shared by ``dynamoctl worker``, ``frontend`` and ``router``."""

    SHORT: ClassVar[dict[str, str]] = {"namespace": "-n"}

    namespace: str = "dynamo"
    """Discovery namespace of the deployment."""
    discovery: str = "embedded"
    """Discovery URL: ``embedded[://DIR]`` or ``etcd://HOST:PORT[,HOST:PORT]``."""
    host: str = "127.0.0.1"
    """Address the component's sockets bind and advertise."""
    lease_ttl: float = Field(default=10.0, ge=2.0)
    """Discovery lease TTL in seconds."""
    discovery_wait: float = Field(default=30.0, gt=0.0)
    """Seconds an unreachable discovery is retried (lease grant, registration) before the
    process exits with an error. A supervisor passes its ``supervision.start_timeout``: a
    process it restarts during an outage waits the outage out instead of giving up."""
    drain_grace: float = Field(default=30.0, ge=0.0)
    """Seconds in-flight work gets to finish on SIGTERM."""
    label: str = ""
    """The supervisor's name for this process (``agg-0``), written into its records."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry traces (recipe ``tracing``); off unless an endpoint is given."""


class WorkerOptions(ComponentSettings):
    """Everything ``dynamoctl worker`` is told on its command line."""

    NOT_FLAGS: ClassVar[frozenset[str]] = frozenset({"engine_options"})

    engine: str = "mocker"
    """Engine adapter name (registry in ``dynamoctl.engines.registry``)."""
    role: Role = "agg"
    """What the instances do: ``agg``, ``prefill`` or ``decode``."""
    num_workers: int = Field(default=1, ge=1)
    """Instances in this process (each its own engine and registration)."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of ``/metrics`` and ``/health``; 0 picks a free one (logged)."""
    parsers: OutputParserSettings = Field(default_factory=OutputParserSettings)
    """How the model writes tool calls and thinking (put on the model card)."""
    standby: bool = False
    """Start as a warm spare: engine ready, registered as standby (out of routing) until
    the supervisor promotes it (recipe ``spares``, docs/operations.md "Warm spares")."""
    model_cache: ModelCacheSettings = Field(default_factory=ModelCacheSettings)
    """The node's model cache the engine's weights are staged into before it starts."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """Engine arguments (the command line's other ``--options``), passed untouched."""
