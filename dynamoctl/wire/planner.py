"""What the planner's ``/health`` answers: its mode and last decision, typed so that the
supervisor's probe and ``dynamoctl status`` never parse its log or metrics
(docs/planner.md, "The running planner")."""

from __future__ import annotations

from typing import Literal

import msgspec

PlannerPhase = Literal["starting", "waiting", "planning"]
"""``starting``: not registered yet; ``waiting``: registered, no supervisor control endpoint
or no deployment state yet (it holds); ``planning``: deciding every interval."""


class PlannerPool(msgspec.Struct, frozen=True, kw_only=True):
    """One scaled pool as the planner sees it."""

    role: str
    desired: int
    """Replicas the planner last asked for."""
    ready: int
    """Replicas the supervisor reports READY."""
    floor: int
    """The throughput loop's floor (0 before its first decision)."""
    budget_bound: bool = False
    """The targets need more replicas than the GPU budget leaves this pool."""
    reason: str = ""
    """Why the last decision did what it did for this pool."""


class PlannerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /health`` of ``dynamoctl planner`` (200 once registered)."""

    phase: PlannerPhase
    mode: str
    """Loops that run: ``both``, ``throughput`` or ``load``."""
    pools: list[PlannerPool] = []
    gpus: int = 0
    """Budget units the desired replicas hold."""
    budget: int = 0
    """The GPU budget."""
    last_loop: str = ""
    """Which loop made the last decision (``load``, ``throughput``); empty before one."""
    last_decision_age_s: float | None = None
    """Seconds since that decision."""
    last_change: str = ""
    """The last decision that changed a pool, in words (``decode 1 -> 2``)."""
    reason: str = ""
    """The last decision's reason, every pool on one line."""
    budget_bound: bool = False
    """Some pool needs more than the budget leaves it (the targets are not met)."""
    scale_error: str = ""
    """The last scale request that failed and is being retried; empty once one succeeds."""
