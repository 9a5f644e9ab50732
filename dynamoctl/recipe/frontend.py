"""A recipe's ``frontend`` section: the OpenAI-compatible endpoint, its processes and
hosts, and its router. Most fields are the components' own options, declared once in
:mod:`dynamoctl.settings`."""

from __future__ import annotations

from pydantic import Field

from dynamoctl.recipe.fields import NonEmptyStr, Port, RecipeModel, rule_error
from dynamoctl.recipe.targets import LocalTarget, SshTarget, Target
from dynamoctl.settings import (
    AdmissionSettings,
    DisaggSettings,
    ImageSettings,
    ReplicaSettings,
    ResponsesSettings,
    RouterSettings,
    StreamSettings,
)
from dynamoctl.settings.frontend import DEFAULT_PORT, ApiKeySettings
from dynamoctl.settings.http import HttpLimitSettings


class Router(RecipeModel, ReplicaSettings, DisaggSettings, RouterSettings):
    """How the frontend picks a worker for each request. The routing and disaggregation
    fields are the components' own options (``dynamoctl frontend --help``), declared once
    in :mod:`dynamoctl.settings`."""

    replicas: int = Field(default=0, ge=0, le=64)
    """Standalone router processes; 0 embeds the router in the frontend. Either routes
    the prefill and decode pools alike. At most 64, far more than failover needs."""


class Frontend(
    RecipeModel,
    HttpLimitSettings,
    ApiKeySettings,
    AdmissionSettings,
    StreamSettings,
    ResponsesSettings,
    ImageSettings,
):
    """The OpenAI-compatible HTTP endpoint."""

    host: NonEmptyStr | None = None
    """Address to listen on. Default: ``127.0.0.1`` on a local target; on ssh and slurm
    targets the head node's address, so that the supervisor and clients on other machines
    reach it. ``0.0.0.0`` listens on every interface of the head node. A loopback address
    is refused on ssh and slurm targets (nothing off the head node could reach it)."""
    port: Port = DEFAULT_PORT
    """TCP port to listen on."""
    processes: int | None = Field(default=None, ge=1, le=64)
    """Frontend processes on each frontend host, all serving ``port`` (``SO_REUSEPORT``:
    the kernel spreads connections over them), each with its own embedded router; the
    routers share their bookings so that they route as one would. Each is an instance of
    its own (``frontend-0``, ``frontend-1``...), restarted and drained alone. Default:
    a quarter of the host's cores, at least 1 and at most 8, leaving the rest to the
    workers and engines beside it (1 on a 2- or 4-core host, 4 on 16 cores); the local
    target counts this machine's cores, ssh and slurm targets get 1 (the plan does not
    know their cores: set it)."""
    hosts: int = Field(default=1, ge=1, le=64)
    """Hosts running frontends: the target's first ``hosts`` (the head first), each with
    ``processes`` frontend processes on ``port``. Put a load balancer in front of them:
    ``dynamoctl lb-config`` writes an HAProxy configuration (docs/operations.md, "Many
    frontends"). More than 1 needs an ssh or slurm target with that many hosts, and
    ``host`` unset or a wildcard (one address is on one host)."""
    router: Router = Field(default_factory=Router)
    """Request routing."""

    def process_count(self, cores: int | None) -> int:
        """Frontend processes per host (``processes``, else the default from ``cores``;
        None: unknown, 1)."""
        if self.processes is not None:
            return self.processes
        return 1 if cores is None else max(1, min(8, cores // 4))


def check_frontend_hosts(hosts: int, listen: str | None, target: Target) -> None:
    """Frontends on ``hosts`` hosts need that many hosts and an address on each."""
    if isinstance(target, LocalTarget):
        raise rule_error("frontend.hosts", "a local target has one host; use processes instead")
    have = len(target.hosts) if isinstance(target, SshTarget) else target.nodes
    if hosts > have:
        raise rule_error("frontend.hosts", f"{hosts} hosts but the target has {have}")
    if listen is not None and listen not in ("0.0.0.0", "::"):
        raise rule_error(
            "frontend.host",
            f"{listen} is one host's address but frontends run on {hosts} hosts; leave it "
            "out (each listens on its host's address) or use 0.0.0.0",
        )
