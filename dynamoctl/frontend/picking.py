"""What a router answers the frontend: a worker, or why there is none (shared by the
request pipeline, the routings and disaggregation)."""

from __future__ import annotations

from typing import NamedTuple


class WorkerChoice(NamedTuple):
    worker_id: str
    address: str
    label: str = ""
    """The worker's name in ``dynamoctl status`` (``agg-1``), when it has one."""

    @property
    def name(self) -> str:
        """How logs name the worker: as ``status`` does, with its instance id."""
        return f"{self.label} ({self.worker_id})" if self.label else self.worker_id


class NoWorkerAvailable(Exception):
    """No worker can take the request now (none serving, all busy, or all excluded)."""

    def __init__(self, message: str, *, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy
        """Workers exist but all are over their busy thresholds: waiting may help."""
