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

Booked blocks are kept as chains, not block by block (:class:`BookedChains`): an agent's
100k-token prompt is 6,000 blocks, and booking and releasing it one dict operation a
block cost more than routing it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass


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


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading blocks two chains of sequence hashes share. A sequence hash names
    its block and every block before it, so chains that agree at block ``i`` agree before
    it: the first disagreement is found by bisection."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class BookedChains:
    """The full prompt blocks booked requests hold on each worker, each counted once.

    A request's blocks are a chain of sequence hashes from its prompt's first block, so a
    worker's booked blocks are a tree, and sorted lexicographically the chains that
    share the most with any chain are its neighbours. A new chain adds the blocks it does
    not share with its deeper neighbour; a leaving one frees what it does not share with
    its neighbours that stay; a prompt's overlap with a worker's bookings is the deeper of
    its neighbours' shares. Each is a bisection over the worker's chains of the same first
    block, and over two chains: never a walk over the blocks."""

    def __init__(self) -> None:
        self._chains: dict[str, dict[int, list[list[int]]]] = {}
        """worker -> first block -> the chains starting there, sorted"""
        self._blocks: dict[str, int] = {}

    def add_worker(self, worker: str) -> None:
        self._chains.setdefault(worker, {})
        self._blocks.setdefault(worker, 0)

    def remove_worker(self, worker: str) -> None:
        self._chains.pop(worker, None)
        self._blocks.pop(worker, None)

    def add(self, worker: str, hashes: Sequence[int]) -> None:
        """Book ``hashes`` on ``worker`` (which must be known)."""
        if not hashes:
            return
        chain = _as_list(hashes)
        same = self._chains[worker].setdefault(chain[0], [])
        at = bisect_left(same, chain)
        self._blocks[worker] += len(chain) - _deepest(chain, same, at)
        same.insert(at, chain)

    def discard(self, worker: str, hashes: Sequence[int]) -> None:
        """Release one booking of ``hashes`` on ``worker``; unknown ones are ignored."""
        by_head = self._chains.get(worker)
        if not hashes or by_head is None or hashes[0] not in by_head:
            return
        chain = _as_list(hashes)
        same = by_head[chain[0]]
        at = bisect_left(same, chain)
        if at == len(same) or same[at] != chain:
            return
        del same[at]
        self._blocks[worker] -= len(chain) - _deepest(chain, same, at)
        if not same:
            del by_head[chain[0]]

    def blocks(self, worker: str) -> int:
        """Distinct blocks booked on ``worker`` (0 for an unknown worker)."""
        return self._blocks.get(worker, 0)

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` its bookings hold; workers
        with none are left out."""
        if not hashes:
            return {}
        chain = _as_list(hashes)
        out = {}
        for worker, by_head in self._chains.items():
            same = by_head.get(chain[0])
            if same:
                at = bisect_left(same, chain)
                out[worker] = _deepest(chain, same, at)
        return out


def _as_list(hashes: Sequence[int]) -> list[int]:
    """Chains compare as lists (a booking's hashes are one already: not copied)."""
    return hashes if isinstance(hashes, list) else list(hashes)


def _deepest(chain: list[int], chains: list[list[int]], at: int) -> int:
    """The most blocks ``chain`` shares with ``chains[at - 1]`` or ``chains[at]``, its
    neighbours in sorted order (0 where there is none)."""
    best = _shared(chain, chains[at - 1]) if at > 0 else 0
    if at < len(chains):
        best = max(best, _shared(chain, chains[at]))
    return best


class ActiveLoad:
    """Booked prefill tokens and active blocks per worker."""

    def __init__(self) -> None:
        self._blocks = BookedChains()  # full blocks held by booked requests
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
        return self._blocks.blocks(worker) + self._private.get(worker, 0)

    def loads(self, workers: Sequence[str]) -> tuple[list[int], list[int]]:
        """Booked prefill tokens and active blocks of each of ``workers`` (known ones)."""
        prefill, private = self._prefill, self._private
        sizes = [self._blocks.blocks(w) for w in workers]
        return [prefill[w] for w in workers], [
            n + private[w] for w, n in zip(workers, sizes, strict=True)
        ]

    def requests(self, worker: str) -> int:
        return self._requests.get(worker, 0)

    def active_overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` booked requests already hold
        there (those cost no new block)."""
        return self._blocks.overlaps(hashes)

    def booking(self, request_id: str) -> Booking | None:
        return self._bookings.get(request_id)

    def __len__(self) -> int:
        return len(self._bookings)
