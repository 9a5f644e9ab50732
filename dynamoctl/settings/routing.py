"""Routing knobs, shared by the embedded router (frontend), ``dynamoctl router`` and the
recipe's ``frontend.router``."""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

from pydantic import Field

from dynamoctl.kv.tiers import DEFAULT_DISK_CREDIT, DEFAULT_HOST_CREDIT
from dynamoctl.settings.base import Options
from dynamoctl.settings.component import ComponentSettings

RouterMode = Literal["round-robin", "random", "least-loaded", "power-of-two", "kv", "kv-approx"]
ROUTER_MODES: tuple[str, ...] = get_args(RouterMode)
"""The policies' names (their registry, ``dynamoctl.router.policies``, is tested equal)."""


class RouterSettings(Options):
    """How a router picks a worker for each request."""

    FLAGS: ClassVar[dict[str, str]] = {"mode": "router-mode"}

    mode: RouterMode = "kv"
    """``kv`` weighs cached prefix overlap (from engines' KV events) against load;
    ``kv-approx`` learns overlap from its own decisions (no events); the other modes ignore
    the cache."""
    overlap_weight: float = Field(default=1.0, ge=0)
    """Weight (alpha) of prefill cost against decode load in the KV cost; 0 ignores prefill
    cost."""
    temperature: float = Field(default=0.0, ge=0)
    """Softmax temperature over worker costs; 0 always picks the cheapest worker."""
    host_tier_credit: float = Field(default=DEFAULT_HOST_CREDIT, ge=0, le=1)
    """What a prompt block in a worker's host-memory KV tier is worth in the KV cost, as a
    fraction of a GPU hit: 1 - onboard time / prefill time of a block (docs/router.md,
    "Tiers"); 0 ignores the tier."""
    disk_tier_credit: float = Field(default=DEFAULT_DISK_CREDIT, ge=0, le=1)
    """The same for a block in a worker's disk KV tier; 0 ignores the tier."""
    busy_kv_usage: float | None = Field(default=0.95, ge=0, le=1)
    """A worker whose KV cache is fuller than this fraction is busy and skipped; when every
    worker is busy, requests queue, then get 503. 1 (or, in a recipe, null): never busy by
    KV usage."""
    busy_waiting: int | None = Field(default=None, ge=0)
    """A worker with more requests waiting than this is busy and skipped. Unset: never busy
    by its queue."""


class ReplicaSettings(Options):
    """How a standalone router replica keeps its state (recipe ``frontend.router``)."""

    booking_ttl: float = Field(default=600.0, ge=1.0)
    """Seconds after which a booking whose release never came is dropped (a frontend that
    died mid-request)."""
    warm_up: float = Field(default=5.0, ge=0.0)
    """Most seconds a replica waits for workers and the other replicas' bookings before
    it serves."""


class RouterOptions(ComponentSettings):
    """Everything ``dynamoctl router`` is told on its command line."""

    router: RouterSettings = Field(default_factory=RouterSettings)
    """Routing mode and weights."""
    replica: ReplicaSettings = Field(default_factory=ReplicaSettings)
    """Its bookings and warm-up."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of ``/metrics`` and ``/health``; 0 picks a free one (registered)."""
    drain_grace: float = Field(default=0.5, ge=0.0)
    """Seconds between leaving discovery and closing, for route calls in flight (they take
    milliseconds)."""
