"""A local instance's end is seen even when the event loop misses it.

uvloop reports no exit for a child whose status another ``waitpid`` took first (libuv
gets ECHILD and drops it): ``Process.wait()`` then never returns, and a supervisor
waiting on it never sees the instance end. :class:`LocalProcess` asks the kernel too (a
pidfd), so its ``wait()`` returns, with :data:`LOST` when the status is gone. Real
children on uvloop, as the supervisor runs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from dynamoctl.launch.api import LOST, InstanceSpec
from dynamoctl.launch.local import LocalLauncher
from dynamoctl.util import aio


def spec(script: str) -> InstanceSpec:
    return InstanceSpec(
        name="frontend-0", pool="frontend", component="frontend", host="localhost",
        argv=["sh", "-c", script],
    )  # fmt: skip


def test_an_exit_whose_status_another_wait_took_is_still_seen(tmp_path: Path) -> None:
    async def main() -> tuple[int, float]:
        proc = await LocalLauncher().start(spec("exit 3"), tmp_path / "f.log")
        time.sleep(1.0)  # noqa: ASYNC251 - the loop blocked on purpose: the keeper exits, unreaped
        stolen = os.waitpid(proc.record.pid, 0)  # noqa: ASYNC222 - taken from the loop
        assert stolen[0] == proc.record.pid
        began = time.monotonic()
        status = await asyncio.wait_for(proc.wait(), 10)
        return status, time.monotonic() - began

    status, took = aio.run(main())
    assert status == LOST and took < 5


def test_the_status_comes_back_at_once_otherwise(tmp_path: Path) -> None:
    async def main() -> tuple[int, int | None, float]:
        proc = await LocalLauncher().start(spec("sleep 0.3; exit 3"), tmp_path / "f.log")
        began = time.monotonic()
        waits = await asyncio.gather(proc.wait(), proc.wait())  # one follower serves both
        assert waits[0] == waits[1]
        return waits[0], proc.returncode, time.monotonic() - began

    status, returncode, took = aio.run(main())
    assert status == returncode == 3 and took < 5
