"""No await holds the supervisor for ever (dynamoctl/supervisor/deadlines.py): an exit is
seen at once whatever a probe is doing, a launch that never returns fails the instance,
and ``down`` finishes even when a process's end is never reported.

The fakes (tests/supervisor/fakes.py) make the stuck await: a probe that never returns
and ignores its cancellation, a launch that never returns, a process whose end, even
SIGKILL's, is never seen. The real mechanism behind the last (an exit the event loop
missed) is tested on a real child in tests/launch/test_missed_exit.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dynamoctl.supervisor.supervisor import StartupFailed
from dynamoctl.wire.states import Phase, State
from tests.supervisor.fakes import (
    FakeLauncher,
    FakeProber,
    make_supervisor,
    recipe_text,
    serving,
    until,
)


@pytest.fixture(autouse=True)
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dynamoctl.supervisor.watch.PROBE_DEADLINE_S", 30.0)
    monkeypatch.setattr("dynamoctl.supervisor.stopping.LIFE_END_S", 0.5)
    monkeypatch.setattr("dynamoctl.launch.api.KILL_WAIT_S", 0.2)


async def test_exit_while_starting_is_seen_though_its_probe_hangs(tmp_path: Path) -> None:
    """The CI hang: frontend-0 exited while STARTING, its readiness probe had not
    returned, so its watch never looked at the process again."""
    launcher, prober = FakeLauncher(), FakeProber()
    prober.hung.add("agg-1")
    loop = asyncio.get_running_loop()

    def exit_soon(proc: object) -> None:
        if proc.spec.name == "agg-1":
            loop.call_later(0.1, proc.exit, 1)

    launcher.on_start = exit_soon
    sup = make_supervisor(tmp_path, recipe_text(), launcher, prober)
    began = time.monotonic()
    try:
        with pytest.raises(StartupFailed, match=r"agg-1 \(worker on localhost\) failed to start"):
            await asyncio.wait_for(sup.run(), 10)
    finally:
        prober.hung.clear()
    assert time.monotonic() - began < 5  # not the probe's 30 s bound, nor the start timeout
    assert sup.instances["agg-1"].state is State.FAILED
    assert sup.instances["agg-1"].message.startswith("exited with status 1")


async def test_exit_of_a_ready_instance_is_seen_though_its_probe_hangs(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        h.prober.hung.add("agg-0")
        await asyncio.sleep(0.05)  # a health probe of agg-0 under way, never to return
        first = h.launcher.current("agg-0")
        first.exit(1)
        try:
            await until(lambda: h.launcher.current("agg-0") is not first, "agg-0 restarted", 3)
        finally:
            h.prober.hung.clear()  # its next process answers
        await h.until_state("agg-0", State.READY)
        assert h.sup.instances["agg-0"].message.startswith("exited with status 1")


async def test_a_launch_that_never_returns_fails_the_start(tmp_path: Path) -> None:
    launcher, prober = FakeLauncher(), FakeProber()
    launcher.gate = asyncio.Event()  # never set: every launch hangs
    sup = make_supervisor(tmp_path, recipe_text(start_timeout=0.5), launcher, prober)
    with pytest.raises(StartupFailed, match=r"its launch on localhost took over 0.5 s"):
        await asyncio.wait_for(sup.run(), 10)
    assert sup.phase is Phase.FAILED


@pytest.mark.parametrize("now", [False, True])
async def test_down_finishes_when_an_end_is_never_seen(tmp_path: Path, now: bool) -> None:
    """A process whose end is never reported, SIGKILL's included: ``down`` kills it,
    gives it up after the bounds and finishes, the instance STOPPED."""
    launcher, prober = FakeLauncher(), FakeProber()
    sup = make_supervisor(tmp_path, recipe_text(drain_timeout=0.2), launcher, prober)
    run = asyncio.create_task(sup.run())
    await until(lambda: sup.phase is Phase.SERVING, "serving")
    lost = launcher.current("agg-0")
    lost.unseen = True
    began = time.monotonic()
    sup.request_down(now=now)
    await asyncio.wait_for(run, 10)
    assert time.monotonic() - began < 8
    assert sup.phase is Phase.STOPPED
    assert {i.state for i in sup.instances.values()} == {State.STOPPED}
    assert 9 in lost.signals  # SIGKILLed before it was given up
