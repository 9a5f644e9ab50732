"""The mocker's priority scheduling (``scheduling_policy: priority``, as vLLM's
``--scheduling-policy priority``): the waiting queue ordered by each request's priority,
higher first (dynamoctl's sense, :attr:`GenerateRequest.priority`; vLLM's values run the
other way), then by arrival; and the running request preempted when blocks run out is
the one of the lowest priority, latest arrived."""

from __future__ import annotations

from collections import deque
from typing import Protocol, TypeVar


class Queued(Protocol):
    @property
    def priority(self) -> int: ...
    @property
    def arrival(self) -> int: ...


S = TypeVar("S", bound=Queued)


def _order(seq: Queued) -> tuple[int, int]:
    return -seq.priority, seq.arrival


def queue_in_order(waiting: deque[S], seq: S) -> None:
    """Put ``seq`` into ``waiting`` before the first request it goes ahead of. A
    preempted request keeps its arrival, so it goes back before the later ones of its
    priority."""
    key = _order(seq)
    for i, other in enumerate(waiting):
        if _order(other) > key:
            waiting.insert(i, seq)
            return
    waiting.append(seq)


def take_victim(running: list[S], start: int) -> S:
    """Remove and return the lowest-priority, latest-arrived of ``running[start:]`` (the
    requests the step has not scheduled yet: those before ``start`` keep their place, as
    the step already counts their tokens)."""
    victim = max(running[start:], key=_order)
    running.remove(victim)
    return victim
