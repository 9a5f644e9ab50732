"""Gap, dedup and restart logic for one publisher's event stream, free of I/O.

:class:`StreamTracker` is fed what the sockets deliver (live messages, replay answers,
timers) and returns what the consumer must see, in order; it also says when to ask the
publisher's replay socket for something. Keeping it pure lets a property test drive it
through arbitrary losses and interleavings.

Rules, in short:

* Deliver seq ``expected`` and advance; older seqs are duplicates (drop); a jump ahead
  is a gap: hold the live message and ask for a replay.
* While a replay is outstanding, live messages are held (keyed by seq, so duplicates
  collapse) and released in order when the replay ends.
* Every replay starts at ``expected - 1``, the *anchor*: the publisher answers with the
  last event we delivered (its hash must match), then what we miss. An answer that jumps
  past ``expected`` means its buffer no longer has the gap: :class:`Lost`, unless a
  snapshot came first. Idle polls are the same request, so lost trailing messages are
  recovered and a silent publisher is still checked.
* A restarted publisher is a new TCP connection, so every (re)connect of the SUB socket
  holds live messages until an anchored replay vouches for them. Live seqs only grow
  within one publisher life, so a live seq that does not is a restart; so is an answer
  with a different anchor payload, or with neither the anchor nor anything after it. A
  restart resets to seq 0 of the new life and announces itself with a Snapshot or
  ``Lost(reason="restart")``. An answer without its anchor but with later entries cannot
  tell a restart from a publisher that outran us: ``Lost(reason="unverified")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias


@dataclass(frozen=True, slots=True)
class Event:
    """Payload ``seq`` of the publisher's stream, delivered once and in order."""

    publisher_id: str
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The publisher's full state as of ``seq`` (-1: before any event): replace what you
    hold for this publisher; events continue at ``seq + 1``."""

    publisher_id: str
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Lost:
    """Events ``first_missing..last_missing`` (inclusive; empty when ``last_missing <
    first_missing``) cannot be recovered; keep applying the events that follow.

    ``reason``:

    * ``"gap"``: the events before the range are still valid (the publisher proved it is in
      the same life); your state lacks the range: mark it approximate, or clear it.
    * ``"restart"``: the publisher restarted; what you hold belongs to its previous life:
      clear it. The range is what the new life's buffer no longer has from its start.
    * ``"unverified"``: events up to ``last_missing`` are missing or may belong to a
      previous life (the publisher's buffer lost the entry that would tell, or it has no
      replay socket): clear your state, as for a restart.
    """

    publisher_id: str
    first_missing: int
    last_missing: int
    reason: Literal["gap", "restart", "unverified"] = "gap"


Item: TypeAlias = Event | Snapshot | Lost


class StreamTracker:
    """Sequencing state of one publisher, as seen by one subscriber."""

    def __init__(self, publisher_id: str, *, max_held: int = 100_000) -> None:
        self.publisher_id = publisher_id
        self.max_held = max_held
        """Live messages held behind a replay; beyond this they are dropped and recovered
        by the next replay, so a stalled replay cannot grow memory without bound."""
        self.expected = 0
        """Next seq to deliver."""
        self.last_live = -1
        self.held: dict[int, bytes] = {}
        self.replay_start: int | None = None
        """Start seq of the outstanding replay request, if any."""
        self._want = False  # a replay is needed
        self._first = True  # no entry of the outstanding answer seen yet
        self._stale = False  # outstanding answer predates a detected restart: ignore it
        self._vouches = False  # outstanding request was sent after the last reconnect
        self._doubted = False  # outstanding answer lacked its anchor
        self._verify = False  # reconnected: continuity unproven until a replay vouches
        self._reset = False  # restart detected, not yet announced to the consumer
        self._tail: int | None = None  # hash of payload expected - 1, if it was an Event
        self._held_at_request = -1  # highest seq held when the outstanding request went out

    # ------------------------------------------------------------------ inputs

    def on_live(self, seq: int, payload: bytes) -> list[Item]:
        if seq <= self.last_live:
            self._restart(last_live=seq)
            self.held[seq] = payload
            return []
        self.last_live = seq
        if seq < self.expected:
            return []
        if self.replay_start is not None or self._want:
            if len(self.held) < self.max_held:
                self.held[seq] = payload
            return []
        if seq == self.expected:
            return self._deliver(seq, payload)
        self.held[seq] = payload
        self._want = True
        return []

    def on_reconnect(self) -> None:
        """The SUB socket (re)connected to the publisher: a new TCP connection may be a
        new publisher life, so hold live messages until an anchored replay sent from now
        on vouches for them. Also covers the initial join. What is held came over the old
        connection, possibly from the old life: dropped, the replay fetches it again."""
        self._want = self._verify = True
        self._vouches = False
        self.held.clear()

    def on_replay(self, seq: int, payload: bytes) -> list[Item]:
        if self._stale or self.replay_start is None:
            return []
        first, self._first = self._first, False
        if seq == self.expected - 1 and (first or self._tail is None):
            # The anchor: the last event we delivered, or (after a snapshot) the event
            # the snapshot ends with.
            if self._tail is not None and hash(payload) != self._tail:
                self._restart(last_live=-1)
            else:
                self._tail = hash(payload)
            return []
        if seq < self.expected:
            return []
        if first and self.replay_start == self.expected - 1:
            # The anchor is gone from the publisher's buffer: it outran us, or restarted.
            self._doubted = True
            return self._deliver(seq, payload, verified=False)
        return self._deliver(seq, payload)

    def on_snapshot(self, seq: int, payload: bytes) -> list[Item]:
        if self._stale or self.replay_start is None:
            return []
        self._first = False
        self._reset = self._verify = False
        self.expected = seq + 1
        self.last_live = min(self.last_live, seq)  # a snapshot below it means a restart
        self._tail = None
        return [Snapshot(self.publisher_id, seq, payload)]

    def on_replay_end(self) -> list[Item]:
        if self.replay_start is None:
            return []
        unanchored = self._first and self.replay_start == self.expected - 1
        stale, vouches, doubted = self._stale, self._vouches, self._doubted
        self._end_request()
        if stale:
            return []
        if unanchored:  # the publisher has neither our last event nor anything after it
            self._restart(last_live=-1)
            return []
        if doubted:  # held live messages may straddle two publisher lives: fetch again
            self.held.clear()
            self._want = True
            return []
        if self._verify and not vouches:  # asked before the reconnect: proves nothing
            return []  # on_reconnect queued the request that will
        self._verify = False
        out = self._release()
        if self._reset and not self._want:  # restarted and nothing to replay
            self._reset = False
            out.append(Lost(self.publisher_id, 0, self.expected - 1, "restart"))
        return out

    def on_replay_failed(self) -> list[Item]:
        """The replay socket gave no answer after all retries (or there is none): give up
        on the gap, report it, and go on with what was held."""
        stale = self._stale
        self._end_request()
        if stale:  # a restart was seen meanwhile; its own request is queued
            return []
        doubt, self._verify = self._verify and self.expected > 0, False
        out: list[Item] = []
        for seq in sorted(self.held):
            payload = self.held.pop(seq)
            if seq >= self.expected:
                out += self._deliver(seq, payload, verified=seq == self.expected and not doubt)
                doubt = False
        if doubt:  # reconnected, and nobody could vouch for what we hold
            out.append(Lost(self.publisher_id, 0, self.expected - 1, "unverified"))
        if self._reset:
            self._reset = False
            out.append(Lost(self.publisher_id, 0, self.expected - 1, "restart"))
        return out

    def on_idle(self) -> None:
        """The stream has been quiet: ask for what follows our last event. That recovers
        lost trailing messages (the answer is just the anchor and END when nothing is
        missing) and notices a publisher that restarted and stayed silent."""
        if self.replay_start is None:
            self._want = True

    # ------------------------------------------------------------------ replay requests

    def next_replay(self) -> int | None:
        """Start seq of a replay to send now, if one is wanted and none is outstanding.

        Every request starts at ``expected - 1``, the anchor: a publisher in the same life
        answers with that event first (we compare its hash with what we delivered),
        a restarted one cannot.
        """
        if self.replay_start is not None or not self._want:
            return None
        self._want = False
        self._held_at_request = max(self.held, default=-1)
        return self.retry_start()

    def retry_start(self) -> int:
        """(Re)compute the start of the outstanding request, sent now: after a timeout,
        entries that did arrive need not come again."""
        self._first, self._vouches, self._doubted = True, True, False
        self.replay_start = max(self.expected - 1, 0)
        return self.replay_start

    # ------------------------------------------------------------------ internals

    def _end_request(self) -> None:
        self.replay_start = None
        self._stale = self._vouches = self._doubted = False

    def _restart(self, *, last_live: int) -> None:
        self._reset = True
        self.expected = 0
        self.last_live = last_live
        self.held.clear()
        self._tail = None
        if self.replay_start is not None:
            self._stale = True
        self._want = True

    def _deliver(self, seq: int, payload: bytes, *, verified: bool = True) -> list[Item]:
        """Deliver ``seq``, announcing a restart or the gap before it.

        ``verified=False``: nothing proved that ``seq`` follows what we delivered in the
        same publisher life, so everything before it is in doubt.
        """
        out: list[Item] = []
        if self._reset:
            self._reset = False
            out.append(Lost(self.publisher_id, 0, seq - 1, "restart"))
        elif not verified and self.expected > 0:
            out.append(Lost(self.publisher_id, 0, seq - 1, "unverified"))
        elif seq > self.expected:
            out.append(Lost(self.publisher_id, self.expected, seq - 1))
        out.append(Event(self.publisher_id, seq, payload))
        self.expected = seq + 1
        self._tail = hash(payload)
        self.held.pop(seq, None)
        return out

    def _release(self) -> list[Item]:
        """After a replay: deliver held messages in order.

        A gap before a message that was already held when the request went out means the
        publisher's buffer does not have it (it would have answered with it, or with
        newer entries that moved us past): Lost. A gap before a later arrival may just
        postdate the answer: ask again.
        """
        out: list[Item] = []
        for seq in sorted(self.held):
            if seq < self.expected:
                del self.held[seq]
            elif seq == self.expected or seq <= self._held_at_request:
                out += self._deliver(seq, self.held[seq])
            else:
                self._want = True
                break
        return out
