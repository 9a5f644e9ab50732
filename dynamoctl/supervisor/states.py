"""Instance states: the one vocabulary the supervisor, ``status`` and the docs share."""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    PENDING = "PENDING"
    """Planned; not started yet (waiting for the instances it depends on)."""
    STARTING = "STARTING"
    """Process started; not ready yet (no discovery record, or not answering)."""
    READY = "READY"
    """Serving: registered in discovery and answering probes."""
    DRAINING = "DRAINING"
    """Asked to stop: out of routing, finishing in-flight work."""
    STOPPED = "STOPPED"
    """Ended on purpose (drain, scale-down, down); never restarted."""
    FAILED = "FAILED"
    """Exited or hung unexpectedly; restarted after BACKOFF unless the restart budget is
    spent, in which case it stays FAILED."""
    BACKOFF = "BACKOFF"
    """Waiting out the restart delay after a failure."""
