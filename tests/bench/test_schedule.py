"""Arrival schedules in virtual time: trace replay, Poisson, and the count and time bounds."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.clock import LoopClock, VirtualTimeLoop
from dynamoctl.bench.schedule import Limits, SendFn, drive
from dynamoctl.bench.workload import (
    Conversation,
    LengthDist,
    poisson_arrivals,
    read_trace,
    synthetic_sessions,
    trace_sessions,
)

T = TypeVar("T")


CLOCK = LoopClock()


def virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh virtual-time loop: timers fire at once, in order."""
    loop = VirtualTimeLoop(start=1000.0)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def recorder(service_s: float = 0.0) -> tuple[SendFn, list[Conversation]]:
    """A send that takes ``service_s`` of virtual time and remembers what it was asked."""
    seen: list[Conversation] = []

    async def send(conv: Conversation, origin: float) -> RequestRecord:
        seen.append(conv)
        start = CLOCK.now() - origin
        await asyncio.sleep(service_s)
        record = RequestRecord(session=conv.session.id, turn=conv.turn, start=start,
                               ttft=service_s, e2e=service_s, output_tokens=1)  # fmt: skip
        conv.advance("", 1)
        return record

    return send, seen


def write_trace(path: Path, n: int = 200) -> list[float]:
    rng = random.Random(7)
    stamps, t = [], 1_700_000_000_000.0
    lines = []
    for i in range(n):
        t += rng.expovariate(1 / 250)  # ~4 requests/s, in milliseconds
        stamps.append(t)
        hashes = [0, 1, 2 + i % 3, 100 + i]  # shared prefix of two blocks, then 3 variants
        lines.append(json.dumps({"timestamp": t, "input_length": 1800, "output_length": 20,
                                 "hash_ids": hashes}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return stamps


@pytest.mark.parametrize("speedup", [1.0, 4.0])
def test_trace_replay_reproduces_arrival_times(tmp_path: Path, speedup: float) -> None:
    stamps = write_trace(tmp_path / "trace.jsonl")
    send, _ = recorder(service_s=0.5)  # overlapping requests: arrivals must not wait
    sessions = trace_sessions(read_trace(tmp_path / "trace.jsonl"), speedup, block_size=512)
    out = virtual(drive(sessions, send, clock=CLOCK, limits=Limits(10_000, 1e6, 1.0)))
    want = [(s - stamps[0]) / 1000 / speedup for s in stamps]
    got = sorted(r.start for r in out.records)
    assert len(got) == len(want)
    assert got == pytest.approx(want, abs=1e-6)
    assert out.max_lag == pytest.approx(0.0, abs=1e-6)


def test_trace_hash_ids_become_shared_blocks(tmp_path: Path) -> None:
    write_trace(tmp_path / "trace.jsonl", n=4)
    a, b, c, _ = trace_sessions(read_trace(tmp_path / "trace.jsonl"), block_size=512)
    pa, pb, pc = (s.turns[0].new_tokens for s in (a, b, c))
    assert len(pa) == 1800 and a.turns[0].max_tokens == 20
    assert pa[:1024] == pb[:1024] == pc[:1024]  # hash ids 0, 1
    assert pa[1024:1536] != pb[1024:1536]  # 2 vs 3


def test_bad_trace_line_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"timestamp": 1, "input_length": 5, "output_length": 1}\n'
                                      '{"timestamp": "x"}\n')  # fmt: skip
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        read_trace(tmp_path / "t.jsonl")


def test_poisson_arrivals_have_the_requested_rate() -> None:
    send, _ = recorder(service_s=0.2)
    sessions = poisson_arrivals(synthetic_sessions(LengthDist.parse("8"), LengthDist.parse("1")),
                                rate=50.0, seed=3)  # fmt: skip
    out = virtual(drive(sessions, send, clock=CLOCK, limits=Limits(4000, 1e6)))
    starts = sorted(r.start for r in out.records)
    assert len(starts) == 4000
    assert len(starts) / starts[-1] == pytest.approx(50.0, rel=0.05)


def test_time_bound_stops_sending_and_drain_cancels() -> None:
    send, _ = recorder(service_s=100.0)  # every request outlives the run and its drain
    sessions = poisson_arrivals(synthetic_sessions(LengthDist.parse("8"), LengthDist.parse("1")),
                                rate=10.0)  # fmt: skip
    limits = Limits(10_000, max_seconds=30.0, drain_seconds=5.0)
    out = virtual(drive(sessions, send, clock=CLOCK, limits=limits))
    assert 250 < out.issued < 350
    assert out.records == [] and out.unfinished == out.issued
    assert out.duration == pytest.approx(35.0)


def test_closed_loop_keeps_turns_in_order_and_stops_at_the_count() -> None:
    send, seen = recorder(service_s=0.1)
    sessions = synthetic_sessions(LengthDist.parse("16"), LengthDist.parse("4"), turns=3,
                                  shared_prefix=8, prefix_groups=2)  # fmt: skip
    out = virtual(drive(sessions, send, clock=CLOCK, limits=Limits(max_requests=20),
                        concurrency=4, think_time=1.0))  # fmt: skip
    assert out.issued == len(out.records) == 20
    # 4 clients; turns take 0.1 s, then 1 s of thinking except after a session's last turn:
    # each client starts turns at 0, 1.1, 2.2, then its next session at 2.3 and 3.4
    assert sorted({round(r.start, 6) for r in out.records}) == [0.0, 1.1, 2.2, 2.3, 3.4]
    by_session: dict[int, list[int]] = {}
    for record in out.records:
        by_session.setdefault(record.session, []).append(record.turn)
    assert all(turns == list(range(len(turns))) for turns in by_session.values())
    prefixes = {tuple(conv.session.prefix) for conv in seen}
    assert len(prefixes) == 2 and all(len(p) == 8 for p in prefixes)


def test_length_distributions() -> None:
    rng = random.Random(1)
    assert LengthDist.parse("64").sample(rng) == 64
    uniform = [LengthDist.parse("uniform:10:20").sample(rng) for _ in range(500)]
    assert min(uniform) >= 10 and max(uniform) <= 20
    normal = [LengthDist.parse("normal:100:10").sample(rng) for _ in range(2000)]
    assert sum(normal) / len(normal) == pytest.approx(100, rel=0.03)
    for bad in ("x", "uniform:5", "normal:1:-1", "uniform:9:3"):
        with pytest.raises(ValueError, match="bad length"):
            LengthDist.parse(bad)
