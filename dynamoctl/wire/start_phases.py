"""How long an instance's start took, phase by phase (``status``, ``state.json``, the
supervisor's ``/metrics``), and the Prometheus names those figures go by, declared once.

A start is timed by the supervisor from the moment it launches the process: staging (the
weights copied onto the node before the engine starts; absent where nothing is staged),
the process start (the launcher's call until the process runs), then until it is first
ready (READY, or STANDBY for a warm spare). A spare's promotion is timed apart: it is not
a start. docs/operations.md, "Start-up phases".
"""

from __future__ import annotations

import msgspec

START_PHASE_SECONDS = "dynamoctl_supervisor_start_phase_seconds"
"""Gauge: seconds of each phase of an instance's last start (label ``phase``: the field
names of :class:`StartPhases` without ``_s``)."""
MEASURED_START_SECONDS = "dynamoctl_supervisor_measured_start_seconds"
"""Gauge: median seconds from launch to ready of the recent starts of a model on a kind of
node (labels ``model``, ``node_kind``), from the history kept in the state directory."""
SPARE_PROMOTIONS = "dynamoctl_supervisor_spare_promotions"
"""Counter: warm spares promoted to READY, by why (``scale``, ``replace``)."""
SPARE_PROMOTION_SECONDS = "dynamoctl_supervisor_spare_promotion_seconds"
"""Gauge: seconds the instance's last promotion took, from asked to READY."""
PROMOTE_TIMEOUT_S = 10.0
"""Seconds a promotion may take before the supervisor judges the spare unable (a cold
start follows): also the planner's lead time for a pool with a spare before any promotion
of it was measured (docs/planner.md, "Start-up")."""


class StartPhases(msgspec.Struct, kw_only=True):
    """The phases of an instance's last start, in seconds; None for a phase not reached
    (or, for ``staging_s``, not done)."""

    staging_s: float | None = None
    """Weights staged onto the node before the process started; None when nothing was
    staged (the node model cache's figure, where the recipe asks for one)."""
    process_s: float | None = None
    """From the launcher's call until the process runs (SSH and Slurm add their round
    trips here)."""
    ready_s: float | None = None
    """From the process running until it was first ready (READY, or STANDBY for a spare):
    the engine's load and initialisation, then its registration."""
    total_s: float | None = None
    """The whole start, staging included."""
    promotion_s: float | None = None
    """For a warm spare made READY: from asked until READY (not part of ``total_s``)."""

    def finished(self) -> bool:
        return self.total_s is not None

    def by_phase(self) -> dict[str, float]:
        """The phases measured, by their name on ``/metrics`` (``staging``, ``process``)."""
        values = msgspec.structs.asdict(self)
        return {k.removesuffix("_s"): v for k, v in values.items() if v is not None}
