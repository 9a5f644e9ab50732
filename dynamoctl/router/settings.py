"""Routing knobs, shared by the embedded router (frontend) and ``dynamoctl router``."""

from __future__ import annotations

from dataclasses import dataclass

from dynamoctl.router.policies import mode_names
from dynamoctl.router.router import KvRouter


@dataclass(frozen=True)
class RouterSettings:
    """Routing knobs (recipe ``frontend.router``)."""

    mode: str = "kv"
    """Policy name; see ``dynamoctl.router.mode_names()``."""
    overlap_weight: float = 1.0
    """Alpha: weight of prefill cost against decode load."""
    temperature: float = 0.0
    """Softmax temperature over costs; 0 picks the cheapest."""
    busy_kv_usage: float | None = 0.95
    """A worker whose KV usage exceeds this is skipped; all busy → 503."""
    busy_waiting: int | None = None
    """A worker with more queued requests than this is skipped."""

    def build(self, block_size: int) -> KvRouter:
        """A router for one model, whose engines use ``block_size``."""
        return KvRouter(
            self.mode,
            block_size,
            overlap_weight=self.overlap_weight,
            temperature=self.temperature,
            busy_kv_usage=self.busy_kv_usage,
            busy_waiting=self.busy_waiting,
        )


def check_mode(mode: str) -> None:
    if mode not in mode_names():
        raise ValueError(f"unknown router mode {mode!r}; valid: {', '.join(mode_names())}")
