"""The index of ``kv-approx`` routing: no KV events, only the router's own decisions.

A prompt routed to a worker is assumed cached there for a while: each of its blocks is
held for ``ttl`` seconds after the worker was last chosen for it, then forgotten.
Matching is :class:`~dynamoctl.router.index.PrefixIndex`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from dynamoctl.router.index import PrefixIndex


class ApproxIndex(PrefixIndex):
    """For ``kv-approx``: no events; the blocks of each routed prompt are assumed cached
    on the chosen worker for ``ttl`` seconds after it was last routed there."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        super().__init__()
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        self.ttl = ttl
        """Seconds a routed block is believed cached."""
        self._clock = clock
        self._expiry: dict[str, OrderedDict[int, float]] = {}  # oldest deadline first

    def add_worker(self, worker: str) -> None:
        super().add_worker(worker)
        self._expiry.setdefault(worker, OrderedDict())

    def remove_worker(self, worker: str) -> None:
        super().remove_worker(worker)
        self._expiry.pop(worker, None)

    def clear_worker(self, worker: str) -> None:
        super().clear_worker(worker)
        if worker in self._expiry:
            self._expiry[worker].clear()

    def record(self, worker: str, hashes: Sequence[int]) -> None:
        """``hashes`` were just routed to ``worker``: cached there until now + ttl."""
        expiry = self._expiry.get(worker)
        if expiry is None:
            return
        deadline = self._clock() + self.ttl
        fresh: list[int] = []
        for h in hashes:
            if h in expiry:
                expiry.move_to_end(h)
            else:
                fresh.append(h)
            expiry[h] = deadline
        self.add(worker, fresh)

    def expire(self) -> None:
        """Forget blocks whose deadline passed."""
        now = self._clock()
        for worker, expiry in self._expiry.items():
            gone: list[int] = []
            while expiry:
                h, deadline = next(iter(expiry.items()))
                if deadline > now:
                    break
                del expiry[h]
                gone.append(h)
            if gone:
                self.discard(worker, gone)
