"""The supervisor's vocabularies, each declared once: instance states, deployment phases,
restart reasons. ``status``, ``/metrics``, ``state.json`` and docs/operations.md use these
members' values; each member's docstring is its spec, and each state machine's table of
allowed transitions is the only place that says which change is legal (the supervisor's
``transition`` checks it).

Defined here rather than in :mod:`dynamoctl.wire.control` (which carries them) because they
are the supervisor's policy; this module imports nothing of the project, so the wire types
and the CLI can import it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from dynamoctl.wire.words import Word


class IllegalTransition(Exception):
    """A change the transition table does not allow: a bug in the supervisor."""


class State(Word):
    """An instance's state, as ``dynamoctl status`` shows it. Allowed changes:
    :data:`STATE_TRANSITIONS`."""

    PENDING = "PENDING"
    """Planned; not started yet (waiting for the group before it in the start order)."""
    STARTING = "STARTING"
    """Process started; not ready yet (no discovery record, or not answering). It fails
    if it exits, or is not ready within ``supervision.start_timeout``."""
    READY = "READY"
    """Serving: registered in discovery and answering probes. It fails if its process
    exits, stops answering probes, or (a worker with requests in flight) generates no token
    for ``supervision.hang_timeout``; after ``budget_window`` READY, its next failure
    restarts with the shortest backoff again."""
    STANDBY = "STANDBY"
    """A warm spare (recipe ``spares``): started and ready like a READY replica, but kept
    out of routing (registered in discovery as standby, not as a worker), so that ``scale``
    up or the replacement of a failed replica is a promotion to READY in about a second
    instead of a start. Probed like READY; it fails, wedges and drains like it."""
    WEDGED = "WEDGED"
    """Was READY, then hung: it answered no probe for ``supervision.wedge_timeout`` (a
    frozen or deadlocked process: its sockets open, nothing answers), or (a worker with
    requests in flight) generated no token for ``hang_timeout``. Out of routing (its
    record is withdrawn), its whole process group (a gang: every member's) SIGKILLed at
    once, since a stopped process handles no SIGTERM; FAILED once it is gone."""
    DRAINING = "DRAINING"
    """Asked to stop (drain, scale-down, ``down``): SIGTERM sent, out of routing, finishing
    in-flight work within ``supervision.drain_timeout``, then SIGKILL."""
    STOPPED = "STOPPED"
    """Ended on purpose (drain, scale-down, ``down``); never restarted, spends no budget."""
    FAILED = "FAILED"
    """Exited or hung unexpectedly; restarted after BACKOFF unless ``up`` is still starting
    (it rolls back instead) or the restart budget is spent (more than ``restart_budget``
    failures within ``budget_window``): then it stays FAILED."""
    BACKOFF = "BACKOFF"
    """Waiting out the restart delay after a failure: ``backoff_base`` doubling per
    consecutive failure up to ``backoff_cap``, with jitter."""


STATE_TRANSITIONS: Mapping[State, frozenset[State]] = {
    State.PENDING: frozenset({State.STARTING, State.STOPPED}),
    # STOPPED from STARTING or READY: stopped before launch returned, or its process ended
    # by itself just as it was asked to stop (no SIGTERM was needed: never DRAINING).
    State.STARTING: frozenset(
        {State.READY, State.STANDBY, State.FAILED, State.DRAINING, State.STOPPED}
    ),
    # READY: promoted (scale up, or a failed replica replaced).
    State.STANDBY: frozenset(
        {State.READY, State.FAILED, State.WEDGED, State.DRAINING, State.STOPPED}
    ),
    State.READY: frozenset({State.FAILED, State.WEDGED, State.DRAINING, State.STOPPED}),
    # DRAINING or STOPPED: asked to stop while it was being put down.
    State.WEDGED: frozenset({State.FAILED, State.DRAINING, State.STOPPED}),
    State.DRAINING: frozenset({State.STOPPED}),
    State.FAILED: frozenset({State.BACKOFF}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED}),
    State.STOPPED: frozenset(),
}
"""Every allowed change of an instance's state; STOPPED is final, and so is FAILED when it
is not followed by BACKOFF (``scale`` makes a new instance under the same name)."""


class Phase(Word):
    """A deployment's phase (``status``, ``state.json``, ``/metrics``). A supervisor moves
    through the first five (:data:`PHASE_TRANSITIONS`); the last two are what commands
    report when there is no supervisor to ask."""

    STARTING = "starting"
    """Preflight, then starting the groups in order; a failure now rolls everything back."""
    SERVING = "serving"
    """Every group started and READY once; instances are supervised and restarted."""
    STOPPING = "stopping"
    """``down``, SIGTERM or Ctrl-C: stopping everything in reverse start order."""
    STOPPED = "stopped"
    """Everything stopped on purpose; the supervisor has exited or is exiting."""
    FAILED = "failed"
    """``up`` could not start (``state.json`` has the ``error``) or the supervisor itself
    failed; it stopped what it had started."""
    QUEUED = "queued"
    """Not a supervisor's: the deployment's Slurm job waits in the queue, no supervisor yet."""
    UNKNOWN = "unknown"
    """Not a supervisor's: nothing recorded says what became of the deployment."""


PHASE_TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.SERVING, Phase.STOPPING, Phase.FAILED}),
    Phase.SERVING: frozenset({Phase.STOPPING, Phase.FAILED}),
    Phase.STOPPING: frozenset({Phase.STOPPED, Phase.FAILED}),
    Phase.STOPPED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.QUEUED: frozenset(),
    Phase.UNKNOWN: frozenset(),
}
"""Every change of phase a supervisor makes; it starts in STARTING."""

SUPERVISOR_PHASES = tuple(p for p in Phase if p not in (Phase.QUEUED, Phase.UNKNOWN))
"""The phases a running supervisor can be in (its ``/metrics`` gauge has one series each)."""


class GrowthState(Word):
    """An extra Slurm job of a deployment grown beyond its allocation (``status``; recipe
    ``target.growth``). Allowed changes: :data:`GROWTH_TRANSITIONS`."""

    QUEUED = "QUEUED"
    """Submitted with sbatch; waiting for its nodes (at most ``growth.start_timeout``)."""
    RUNNING = "RUNNING"
    """Its nodes belong to the deployment: replicas are placed there, as job steps of it."""
    RELEASING = "RELEASING"
    """Not needed any more: no replica runs on its nodes (they were drained), or a
    scale-down withdrew the replicas it was queued for. Being cancelled."""
    RELEASED = "RELEASED"
    """Cancelled by the supervisor and gone from the queue; its nodes left the deployment."""
    FAILED = "FAILED"
    """Never ran within ``growth.start_timeout``, or ended by itself (time limit, node
    failure, an operator's scancel); its replicas there failed or were never started."""


GROWTH_TRANSITIONS: Mapping[GrowthState, frozenset[GrowthState]] = {
    GrowthState.QUEUED: frozenset({GrowthState.RUNNING, GrowthState.RELEASING, GrowthState.FAILED}),
    GrowthState.RUNNING: frozenset({GrowthState.RELEASING, GrowthState.FAILED}),
    GrowthState.RELEASING: frozenset({GrowthState.RELEASED, GrowthState.FAILED}),
    GrowthState.RELEASED: frozenset(),
    GrowthState.FAILED: frozenset(),
}
"""Every allowed change of an extra job's state; RELEASED and FAILED are final."""


class RestartReason(Word):
    """Why an instance failed and was restarted (the restart counter's ``reason``)."""

    EXIT = "exit"
    """Its process exited on its own: a crash, or a kill from outside."""
    HANG = "hang"
    """A worker with requests in flight generated no token for ``hang_timeout``: WEDGED,
    SIGKILLed."""
    WEDGE = "wedge"
    """It answered no probe at all for ``wedge_timeout`` (frozen, deadlocked): WEDGED,
    SIGKILLed."""
    PROBE = "probe"
    """It answered probes unhealthy (not ready, no registration: lease lost) for
    ``hang_timeout``: killed (SIGTERM, then SIGKILL)."""
    START_TIMEOUT = "start_timeout"
    """Not READY within ``start_timeout``: killed."""
    LAUNCH = "launch"
    """The launcher could not start it."""


StateT = TypeVar("StateT", State, Phase, GrowthState)


def check_transition(
    table: Mapping[StateT, frozenset[StateT]], old: StateT, new: StateT, what: str
) -> None:
    """Raise :class:`IllegalTransition` unless ``table`` allows ``old -> new``."""
    if new not in table[old]:
        allowed = ", ".join(sorted(str(s) for s in table[old])) or "none: it is final"
        raise IllegalTransition(f"{what}: {old} -> {new} is not allowed (from {old}: {allowed})")
