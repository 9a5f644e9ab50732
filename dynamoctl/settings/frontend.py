"""The frontend's knobs beyond routing: conditional disaggregation and admission."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from dynamoctl.settings.base import Options
from dynamoctl.settings.component import ComponentSettings
from dynamoctl.settings.routing import RouterSettings

DisaggMode = Literal["auto", "required", "off"]


class DisaggSettings(Options):
    """When a request of a disaggregated model is prefilled on a prefill worker."""

    disaggregation: DisaggMode = "auto"
    """With prefill workers: ``auto`` prefills long prompts on a prefill worker and falls
    back to prefilling on the decode worker while none is alive; ``required`` answers 503
    instead of falling back; ``off`` never uses prefill workers."""
    min_remote_prefill_tokens: int = Field(default=256, ge=0)
    """Prompts with fewer uncached tokens than this (counted against the decode workers'
    caches) are prefilled on their decode worker: a hand-off costs more than it saves."""
    max_prefill_attempts: int = Field(default=2, ge=1)
    """Prefill workers tried per request before falling back to a local prefill (or 503
    with ``required``)."""


class AdmissionSettings(Options):
    """What happens to a request when every worker is busy."""

    queue_timeout: float = Field(default=5.0, ge=0)
    """Seconds a request waits for a worker that is not busy, then gets 503 with
    ``Retry-After``."""
    max_queued: int = Field(default=256, ge=0)
    """Requests allowed to wait at once; beyond it, 503 at once."""


class FrontendOptions(ComponentSettings):
    """Everything ``dynamoctl frontend`` is told on its command line."""

    FLAGS: ClassVar[dict[str, str]] = {"routing": "router", "route_timeout": "router-timeout"}

    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port; 0 picks a free one (logged and registered)."""
    routing: Literal["embedded", "standalone"] = "embedded"
    """Where routing decisions are made: ``embedded`` (in this process) or ``standalone``
    (ask the namespace's ``dynamoctl router`` replicas; the routing flags are then
    theirs)."""
    route_timeout: float = Field(default=1.0, ge=0.01)
    """Standalone: seconds a router replica may take to answer before the next is asked."""
    router: RouterSettings = Field(default_factory=RouterSettings)
    """Routing mode and weights of the embedded router."""
    disagg: DisaggSettings = Field(default_factory=DisaggSettings)
    """Conditional disaggregation (prefill workers)."""
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    """The queue in front of busy workers."""
