"""Slurm job states: the one vocabulary the login-node commands read ``squeue`` with.

Every state ``squeue --states=all -o %T`` can print (Slurm 22.05 to 24.x), each in one of
three groups that decide what a command does with a submitted deployment: wait
(``queued``), talk to its supervisor (``active``), or stop waiting and say how it ended
(``ended``). A state a newer Slurm adds reads as ``UNKNOWN``, which is active: commands then
ask the supervisor rather than declare the job over.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    """Queued, waiting for resources or priority."""
    REQUEUED = "REQUEUED"
    """Put back in the queue (preempted with requeue, node failure with requeue)."""
    REQUEUE_HOLD = "REQUEUE_HOLD"
    """Requeued and held: runs again once released."""
    REQUEUE_FED = "REQUEUE_FED"
    """Requeued by a federation sibling."""
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    """Held because its reservation was deleted."""
    CONFIGURING = "CONFIGURING"
    """Allocated; nodes booting or being set up."""
    RUNNING = "RUNNING"
    """The batch script (the supervisor) runs."""
    SUSPENDED = "SUSPENDED"
    """Allocated but suspended (gang scheduling, ``scontrol suspend``)."""
    STOPPED = "STOPPED"
    """Stopped with SIGSTOP; keeps its allocation."""
    SIGNALING = "SIGNALING"
    """Being signalled."""
    RESIZING = "RESIZING"
    """Changing size."""
    STAGE_OUT = "STAGE_OUT"
    """Staging out burst-buffer data after running."""
    COMPLETING = "COMPLETING"
    """Ending: some processes are still being cleaned up on its nodes."""
    COMPLETED = "COMPLETED"
    """Ended with exit code 0."""
    CANCELLED = "CANCELLED"
    """Cancelled by a user or an administrator."""
    FAILED = "FAILED"
    """Ended with a non-zero exit code or another failure."""
    TIMEOUT = "TIMEOUT"
    """Hit its time limit."""
    NODE_FAIL = "NODE_FAIL"
    """Ended because one of its nodes failed."""
    BOOT_FAIL = "BOOT_FAIL"
    """Ended because its nodes failed to boot."""
    DEADLINE = "DEADLINE"
    """Ended at its ``--deadline``."""
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    """Ended because a process exceeded its memory limit."""
    PREEMPTED = "PREEMPTED"
    """Ended by preemption (without requeue)."""
    REVOKED = "REVOKED"
    """Revoked: a federation sibling started it."""
    SPECIAL_EXIT = "SPECIAL_EXIT"
    """Requeued into a held special state by its exit code: not coming back by itself."""
    UNKNOWN = "UNKNOWN"
    """A state this dynamoctl does not know (a newer Slurm): treated as active."""

    @classmethod
    def _missing_(cls, value: object) -> JobState:
        return cls.UNKNOWN

    @property
    def queued(self) -> bool:
        """Waiting to run: no supervisor yet."""
        return self in _QUEUED

    @property
    def ended(self) -> bool:
        """Over for good: nothing of the deployment runs (or soon will not)."""
        return self in _ENDED

    @property
    def active(self) -> bool:
        """Allocated: its supervisor runs, or is about to, or is finishing."""
        return not (self.queued or self.ended)


_QUEUED = frozenset(
    {
        JobState.PENDING,
        JobState.REQUEUED,
        JobState.REQUEUE_HOLD,
        JobState.REQUEUE_FED,
        JobState.RESV_DEL_HOLD,
    }
)
_ENDED = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.PREEMPTED,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
    }
)
