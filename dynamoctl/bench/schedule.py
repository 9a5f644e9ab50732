"""When requests are sent: closed loop (N sessions at once) or open loop (sessions arrive at
their ``arrival`` times: Poisson or a trace), always bounded in count and in time.

Turns of one session are sequential: a turn is sent when the previous reply has ended,
so multi-turn prompts carry real history. The clock is injected (``clock.py``) so arrival
times can be verified in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import msgspec

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.clock import Clock
from dynamoctl.bench.workload import Api, Conversation, Session

SendFn = Callable[[Conversation, float], Awaitable[RequestRecord]]


class Limits(msgspec.Struct, frozen=True):
    max_requests: int = 100
    """No request is sent after this many."""
    max_seconds: float = 60.0
    """No request is sent after this long."""
    drain_seconds: float = 30.0
    """Then requests still open get this long before they are cancelled (``unfinished``)."""
    max_inflight: int = 1024
    """Open loop: sessions played at once; later arrivals wait (their lag is reported)."""


class RunOutcome(msgspec.Struct):
    records: list[RequestRecord]
    issued: int
    duration: float
    """Run start to the end of the last request (or to the cancellation)."""
    max_lag: float = 0.0
    """Open loop: the most a session started after its arrival time."""

    @property
    def unfinished(self) -> int:
        return self.issued - len(self.records)


class _Run:
    def __init__(
        self,
        send: SendFn,
        clock: Clock,
        limits: Limits,
        api: Api,
        text: bool,
        think_time: float,
        on_record: Callable[[RequestRecord], None] | None,
    ) -> None:
        self.send = send
        self.clock = clock
        self.limits = limits
        self.api = api
        self.text = text
        self.think_time = think_time
        self.on_record = on_record
        self.origin = clock.now()
        self.deadline = self.origin + limits.max_seconds
        self.issued = 0
        self.records: list[RequestRecord] = []
        self.max_lag = 0.0

    def may_issue(self) -> bool:
        return self.issued < self.limits.max_requests and self.clock.now() < self.deadline

    async def play(self, session: Session) -> None:
        conv = Conversation(session, self.api, self.text)
        while not conv.done and self.may_issue():
            self.issued += 1
            record = await self.send(conv, self.origin)
            self.records.append(record)
            if self.on_record is not None:
                self.on_record(record)
            if self.think_time and not conv.done:
                await self.clock.sleep_until(self.clock.now() + self.think_time)

    async def closed(
        self, sessions: Iterator[Session], concurrency: int
    ) -> set[asyncio.Task[None]]:
        async def client() -> None:
            while self.may_issue():
                session = next(sessions, None)
                if session is None:
                    return
                await self.play(session)

        return {asyncio.create_task(client()) for _ in range(concurrency)}

    async def open(self, sessions: Iterator[Session], tasks: set[asyncio.Task[None]]) -> None:
        slots = asyncio.Semaphore(self.limits.max_inflight)
        for session in sessions:
            due = self.origin + (session.arrival or 0.0)
            if due >= self.deadline:
                return
            await self.clock.sleep_until(due)
            await slots.acquire()
            if not self.may_issue():
                return
            self.max_lag = max(self.max_lag, self.clock.now() - due)
            task = asyncio.create_task(self.play(session))
            task.add_done_callback(lambda _: slots.release())
            tasks.add(task)


async def drive(
    sessions: Iterator[Session],
    send: SendFn,
    *,
    clock: Clock,
    limits: Limits,
    concurrency: int | None = None,
    api: Api = "completions",
    text: bool = False,
    think_time: float = 0.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> RunOutcome:
    """Play ``sessions``: ``concurrency`` at a time (closed loop) or, when it is None, each
    at its ``arrival`` (open loop). Returns once nothing is in flight, after at most
    ``max_seconds + drain_seconds`` of real time."""
    run = _Run(send, clock, limits, api, text, think_time, on_record)
    loop = asyncio.get_running_loop()
    began = loop.time()
    tasks: set[asyncio.Task[None]] = set()
    if concurrency is not None:
        tasks = await run.closed(sessions, concurrency)
    else:
        dispatcher = asyncio.create_task(run.open(sessions, tasks))
        done, _ = await asyncio.wait({dispatcher}, timeout=limits.max_seconds)
        if not done:
            dispatcher.cancel()
    left = max(0.0, limits.max_seconds - (loop.time() - began)) + limits.drain_seconds
    pending = {t for t in tasks if not t.done()}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=left)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    duration = clock.now() - run.origin
    return RunOutcome(run.records, run.issued, duration, run.max_lag)
