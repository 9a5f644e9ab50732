"""StreamTracker, the pure gap/dedup/restart logic of the event subscriber.

The property test plays a publisher (with the real replay-answer function), a lossy,
reordering-free network and the tracker against each other in arbitrary interleavings, and
checks that the consumer's view never silently diverges.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl import wire
from dynamoctl.planes.events import Event, Item, Lost, Snapshot, StreamTracker
from dynamoctl.planes.events.publisher import replay_answer


def feed_answer(tracker: StreamTracker, frames: list[tuple[bytes, ...]]) -> list[Item]:
    out: list[Item] = []
    for f in frames:
        if len(f) == 3:
            out += tracker.on_snapshot(wire.snapshot_seq_from_bytes(f[0]), f[1])
        elif f[0] == wire.END_SEQ:
            out += tracker.on_replay_end()
        else:
            out += tracker.on_replay(wire.seq_from_bytes(f[0]), f[1])
    return out


def entries(n: int, tag: str = "") -> list[tuple[int, bytes]]:
    return [(i, f"{tag}{i}".encode()) for i in range(n)]


def seqs(items: list[Item]) -> list[int]:
    return [i.seq for i in items if isinstance(i, Event)]


def test_in_order_live_messages_pass_straight_through() -> None:
    t = StreamTracker("p")
    assert seqs(t.on_live(0, b"a") + t.on_live(1, b"b")) == [0, 1]
    assert t.next_replay() is None


def test_a_gap_holds_live_messages_until_the_replay_fills_it() -> None:
    t = StreamTracker("p")
    t.on_live(0, b"0")
    assert t.on_live(3, b"3") == []
    assert t.next_replay() == 0  # anchored at the last delivered event
    assert t.on_live(4, b"4") == []  # held behind the replay
    out = feed_answer(t, replay_answer(entries(5), 5, 0, None))
    assert seqs(out) == [1, 2, 3, 4]
    assert t.next_replay() is None


def test_late_join_asks_from_zero() -> None:
    t = StreamTracker("p")
    t.on_live(7, b"7")
    assert t.next_replay() == 0
    assert seqs(feed_answer(t, replay_answer(entries(8), 8, 0, None))) == list(range(8))


def test_an_evicted_gap_is_lost_not_skipped() -> None:
    t = StreamTracker("p")
    t.on_live(0, b"0")
    t.on_live(9, b"9")
    start = t.next_replay()
    assert start == 0
    out = feed_answer(t, replay_answer(entries(10)[6:], 10, start, None))
    # Without the anchor (seq 0) the publisher cannot prove it did not restart meanwhile.
    assert out[0] == Lost("p", 0, 5, "unverified")
    assert seqs(out) == [6, 7, 8, 9]


def test_a_gap_after_a_verified_anchor_is_a_plain_gap() -> None:
    t = StreamTracker("p")
    t.on_live(0, b"0")
    t.on_live(9, b"9")
    t.next_replay()
    # A buffer that has the anchor but not 1..5 (a snapshot provider lagging behind).
    answer = [(wire.seq_to_bytes(0), b"0"), *replay_answer(entries(10)[6:], 10, 6, None)]
    out = feed_answer(t, answer)
    assert out[0] == Lost("p", 1, 5)
    assert seqs(out) == [6, 7, 8, 9]


def test_an_evicted_gap_with_a_snapshot_is_a_snapshot() -> None:
    t = StreamTracker("p")
    t.on_live(0, b"0")
    t.on_live(9, b"9")
    start = t.next_replay()
    assert start is not None
    out = feed_answer(t, replay_answer(entries(10)[8:], 10, start, lambda: (9, b"state")))
    assert out == [Snapshot("p", 9, b"state")]
    assert t.expected == 10


def test_no_replay_socket_reports_the_gap() -> None:
    t = StreamTracker("p")
    t.on_live(0, b"0")
    t.on_live(2, b"2")
    assert t.next_replay() == 0
    assert t.on_replay_failed() == [Lost("p", 0, 1, "unverified"), Event("p", 2, b"2")]


def test_a_live_seq_going_back_is_a_restart() -> None:
    t = StreamTracker("p")
    for i in range(5):
        t.on_live(i, b"old")
    assert t.on_live(1, b"new1") == []
    assert t.next_replay() == 0
    out = feed_answer(t, replay_answer([(0, b"new0"), (1, b"new1")], 2, 0, None))
    assert out == [Lost("p", 0, -1, "restart"), Event("p", 0, b"new0"), Event("p", 1, b"new1")]


def test_a_silent_restarted_publisher_is_caught_by_the_idle_poll() -> None:
    t = StreamTracker("p")
    for i in range(5):
        t.on_live(i, b"old")
    t.on_idle()
    start = t.next_replay()
    assert start == 4
    assert feed_answer(t, replay_answer([], 0, start, None)) == []  # no anchor: restart
    assert t.next_replay() == 0
    assert feed_answer(t, replay_answer([], 0, 0, None)) == [Lost("p", 0, -1, "restart")]


def test_a_restarted_publisher_past_the_old_seq_is_caught_by_the_anchor() -> None:
    t = StreamTracker("p")
    for seq, payload in entries(3, "old"):
        t.on_live(seq, payload)
    t.on_idle()
    start = t.next_replay()
    assert start is not None
    assert feed_answer(t, replay_answer(entries(6, "new"), 6, start, None)) == []
    assert t.next_replay() == 0
    out = feed_answer(t, replay_answer(entries(6, "new"), 6, 0, None))
    assert out[0] == Lost("p", 0, -1, "restart")
    assert [i.payload for i in out[1:] if isinstance(i, Event)] == [p for _, p in entries(6, "new")]


# --------------------------------------------------------------------------- property


@dataclass
class Publisher:
    buffer_size: int
    with_snapshot: bool
    life: int = 0
    log: list[bytes] = field(default_factory=list)  # payloads of the current life

    def publish(self) -> tuple[int, bytes]:
        payload = f"{self.life}:{len(self.log)}".encode()
        self.log.append(payload)
        return len(self.log) - 1, payload

    def restart(self) -> None:
        self.life += 1
        self.log = []

    def answer(self, start: int) -> list[tuple[bytes, ...]]:
        first = max(0, len(self.log) - self.buffer_size)
        buffer = [(s, self.log[s]) for s in range(first, len(self.log))]
        snap = None
        if self.with_snapshot:
            snap = lambda: (len(self.log) - 1, msgspec.msgpack.encode(self.log))  # noqa: E731
        return replay_answer(buffer, len(self.log), start, snap)


@dataclass
class Consumer:
    """Applies items; remembers which seqs it was told are missing."""

    state: dict[int, bytes] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)
    lost: int = 0
    last_seq: int = -1

    def apply(self, items: list[Item]) -> None:
        for item in items:
            if isinstance(item, Event):
                assert item.seq > self.last_seq, "events out of order or duplicated"
                self.state[item.seq] = item.payload
                self.last_seq = item.seq
            elif isinstance(item, Snapshot):
                log = msgspec.msgpack.decode(item.payload)
                self.state = dict(enumerate(log))
                self.missing.clear()
                self.last_seq = item.seq
            else:
                self.lost += 1
                if item.reason == "gap":
                    assert item.first_missing == self.last_seq + 1
                    self.missing.update(range(item.first_missing, item.last_missing + 1))
                else:  # restart, unverified: what we hold is in doubt
                    assert item.first_missing == 0
                    self.state.clear()
                    self.missing = set(range(item.last_missing + 1))
                self.last_seq = item.last_missing


ACTIONS = ["publish", "live", "serve", "replay", "idle", "timeout", "restart"]


@settings(max_examples=300, deadline=None)
@given(
    buffer_size=st.integers(1, 40),
    with_snapshot=st.booleans(),
    script=st.lists(st.tuples(st.sampled_from(ACTIONS), st.booleans()), max_size=120),
)
def test_the_consumer_never_silently_diverges(
    buffer_size: int, with_snapshot: bool, script: list[tuple[str, bool]]
) -> None:
    pub = Publisher(buffer_size, with_snapshot)
    tracker, consumer = StreamTracker("p"), Consumer()
    live: deque[tuple[int, bytes] | None] = deque()  # None: the SUB socket reconnected
    answer: deque[tuple[bytes, ...]] = deque()
    request: int | None = None  # sent, not yet served
    gave_up = False

    def step() -> None:
        nonlocal request
        start = tracker.next_replay()
        if start is not None:
            request = start

    def deliver_live() -> None:
        msg = live.popleft()
        if msg is None:
            tracker.on_reconnect()
        else:
            consumer.apply(tracker.on_live(*msg))

    def drain() -> None:
        nonlocal request
        while live or request is not None or answer:
            if live:
                deliver_live()
            elif request is not None:
                answer.extend(pub.answer(request))
                request = None
            else:
                consumer.apply(feed_answer(tracker, [answer.popleft()]))
            step()

    for action, flag in script:
        if action == "publish":
            msg = pub.publish()
            if flag:  # else dropped by a high-water mark
                live.append(msg)
        elif action == "live" and live:
            deliver_live()
        elif action == "serve" and request is not None:
            answer.extend(pub.answer(request))
            request = None
        elif action == "replay" and answer:
            consumer.apply(feed_answer(tracker, [answer.popleft()]))
        elif action == "idle":
            tracker.on_idle()
        elif action == "timeout" and tracker.replay_start is not None:
            answer.clear()
            if flag:
                request = tracker.retry_start()
            else:
                gave_up = True
                request = None
                consumer.apply(tracker.on_replay_failed())
        elif action == "restart" and pub.life < 2:
            pub.restart()
            live.append(None)
        step()

    # Quiescence: deliver everything, then idle polls until one changes nothing.
    drain()
    for _ in range(10):
        before = (tracker.expected, len(consumer.state), len(consumer.missing))
        tracker.on_idle()
        step()
        drain()
        settled = tracker.expected == len(pub.log) and not tracker.held
        if settled and before == (tracker.expected, len(consumer.state), len(consumer.missing)):
            break
    else:
        raise AssertionError("the tracker did not settle")

    # Every seq of the publisher's current life is either known exactly or reported lost.
    for seq, payload in enumerate(pub.log):
        assert consumer.state.get(seq) == payload or seq in consumer.missing, seq
    assert all(seq < len(pub.log) for seq in consumer.state)
    # Losses happen only where they must: without a snapshot when the buffer was outrun, a
    # replay given up, or (conservatively) around a restart.
    if not gave_up and pub.life == 0 and (with_snapshot or buffer_size >= len(pub.log)):
        assert consumer.lost == 0
        assert consumer.state == dict(enumerate(pub.log))
    if with_snapshot and not gave_up:
        assert consumer.state == dict(enumerate(pub.log))
