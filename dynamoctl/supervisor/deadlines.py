"""Bounds on the supervisor's awaits: no probe, launch, stop or close may hold it for ever.

A supervisor that waits without a bound on one instance stops supervising all of them: a
frontend's probe that never returned kept its watch from seeing the frontend exit, and
``down`` from finishing (docs/operations.md, "Deadlines"). Work that outlives its bound
is cancelled and *not waited for* (an await that ignores its cancellation must not hold
the caller either); what it was doing is judged as a silence, a failed launch, or an
instance given up.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

PROBE_DEADLINE_S = 15.0
"""Seconds one probe may take (a readiness probe is up to three HTTP requests of a few
seconds each); one that takes longer is an unanswered probe."""
LIFE_END_S = 15.0
"""Seconds an instance's life task gets, once its process is stopped, to record the end;
then it is cancelled and the teardown records the instance STOPPED itself."""
CLOSE_DEADLINE_S = 5.0
"""Seconds each of the supervisor's connections (discovery, probes) may take to close."""


class Outcome(enum.Enum):
    """Why :func:`race` has no result."""

    ENDED = "ended"
    """The process ended first."""
    LATE = "late"
    """The work did not finish within its bound."""


_abandoned: set[asyncio.Future[Any]] = set()
"""Work cancelled and not waited for, held until it is done (the loop keeps only weak
references to tasks)."""


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; its outcome, whatever it is, is dropped."""
    task.cancel()
    if task.done():
        return
    _abandoned.add(task)

    def dropped(done: asyncio.Future[Any]) -> None:
        _abandoned.discard(done)
        if not done.cancelled():
            done.exception()  # retrieved: no "exception was never retrieved" at exit

    task.add_done_callback(dropped)


async def race(work: Awaitable[T], ended: asyncio.Future[Any], seconds: float) -> T | Outcome:
    """``work``'s result, unless ``ended`` is done first (:attr:`Outcome.ENDED`) or
    ``seconds`` pass (:attr:`Outcome.LATE`); then ``work`` is abandoned."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, ended}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            abandon(task)
    if ended.done():
        return Outcome.ENDED
    return task.result() if task.done() else Outcome.LATE


async def within(work: Awaitable[object], seconds: float, what: str) -> bool:
    """Run ``work`` for at most ``seconds``; False (logged, ``work`` abandoned) when it
    did not finish. Its error, if it raised one, is raised."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    finally:
        if not task.done():
            abandon(task)
    if not done:
        log.warning("%s did not finish within %g s: left behind", what, seconds)
        return False
    task.result()
    return True
