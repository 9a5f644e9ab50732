"""What the router has sent to each worker and not yet heard back about.

Engines report their load on the load stream, but only every few tens of milliseconds:
a burst of requests would all see the same stale numbers and pile onto one worker. So
the router books each request's load itself on ``pick`` and feeds it back at once:

* **prefill tokens**: the prompt tokens the worker must compute (not cached there),
  released at the request's first token;
* **active blocks**: the KV blocks the request holds, released when it finishes. Full
  prompt blocks are shared by requests with a common prefix (paged attention with
  prefix caching holds one copy), so they are counted once per worker through a
  reference counted :class:`~dynamoctl.router.index.PrefixIndex`. Each request also
  owns one private block: its partial last prompt block, or the block its first output
  tokens fill. That block is what keeps identical, fully cached prompts from all
  landing on one worker: each one adds load there, so a burst spreads once the cached
  worker is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dynamoctl.router.index import PrefixIndex


@dataclass(slots=True)
class Booking:
    """One routed request's share of its worker's load."""

    worker_id: str
    """Where the request went."""
    prefill_tokens: int
    """Prompt tokens booked for prefill (0 once the first token came)."""
    hashes: Sequence[int]
    """Sequence hashes of the prompt's full blocks, held until the request finishes."""
    private: int = 1
    """Blocks only this request holds (see the module doc)."""


class ActiveLoad:
    """Booked prefill tokens and active blocks per worker."""

    def __init__(self) -> None:
        self._blocks = PrefixIndex()  # full blocks held by booked requests
        self._prefill: dict[str, int] = {}
        self._private: dict[str, int] = {}
        self._requests: dict[str, int] = {}
        self._bookings: dict[str, Booking] = {}

    def add_worker(self, worker: str) -> None:
        self._blocks.add_worker(worker)
        for counter in (self._prefill, self._private, self._requests):
            counter.setdefault(worker, 0)

    def remove_worker(self, worker: str) -> None:
        """Forget ``worker`` and the bookings on it (their releases become no-ops)."""
        self._blocks.remove_worker(worker)
        for counter in (self._prefill, self._private, self._requests):
            counter.pop(worker, None)
        for rid in [r for r, b in self._bookings.items() if b.worker_id == worker]:
            del self._bookings[rid]

    def book(self, request_id: str, booking: Booking) -> None:
        """Book a request on its worker (which must be known); an earlier booking under
        the same id (a retry) is released first."""
        self.finish(request_id)
        worker = booking.worker_id
        self._bookings[request_id] = booking
        self._blocks.add(worker, booking.hashes)
        self._prefill[worker] += booking.prefill_tokens
        self._private[worker] += booking.private
        self._requests[worker] += 1

    def first_token(self, request_id: str) -> bool:
        """The request's prompt is computed: release its prefill tokens."""
        booking = self._bookings.get(request_id)
        if booking is None or not booking.prefill_tokens:
            return False
        self._prefill[booking.worker_id] -= booking.prefill_tokens
        booking.prefill_tokens = 0
        return True

    def finish(self, request_id: str) -> bool:
        """The request ended (any way): release all it booked. False if unknown."""
        booking = self._bookings.pop(request_id, None)
        if booking is None:
            return False
        worker = booking.worker_id
        self._prefill[worker] -= booking.prefill_tokens
        self._blocks.discard(worker, booking.hashes)
        self._private[worker] -= booking.private
        self._requests[worker] -= 1
        return True

    # ------------------------------------------------------------------ views

    def prefill_tokens(self, worker: str) -> int:
        return self._prefill.get(worker, 0)

    def active_blocks(self, worker: str) -> int:
        return self._blocks.tree_size(worker) + self._private.get(worker, 0)

    def loads(self, workers: Sequence[str]) -> tuple[list[int], list[int]]:
        """Booked prefill tokens and active blocks of each of ``workers`` (known ones)."""
        prefill, private = self._prefill, self._private
        sizes = self._blocks.tree_sizes(workers)
        return [prefill[w] for w in workers], [
            n + private[w] for w, n in zip(workers, sizes, strict=True)
        ]

    def requests(self, worker: str) -> int:
        return self._requests.get(worker, 0)

    def active_overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` booked requests already hold
        there (those cost no new block)."""
        return self._blocks.find_matches(hashes)

    def booking(self, request_id: str) -> Booking | None:
        return self._bookings.get(request_id)

    def __len__(self) -> int:
        return len(self._bookings)
