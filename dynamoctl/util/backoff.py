"""Exponential backoff with jitter, shared by every retry loop in the project."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays ``base·2^n`` capped at ``cap``, each drawn uniformly from
    ``[delay/2, delay]``.

    Jitter spreads reconnect storms (many workers losing etcd at the same moment)
    instead of synchronising them.
    """

    base: float = 0.1
    """First delay bound in seconds."""
    cap: float = 5.0
    """Largest delay bound in seconds."""
    attempt: int = field(default=0, init=False)

    def next(self) -> float:
        bound = min(self.cap, self.base * (2**self.attempt))
        self.attempt += 1
        return random.uniform(bound / 2, bound)

    def reset(self) -> None:
        self.attempt = 0
