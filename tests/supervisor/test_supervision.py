"""The supervision policy over a fake launcher and fake probes (tests/supervisor/fakes.py):
restarts within a budget, backoff and its reset, hang and probe kills, drains and scales
that spend no budget and give GPUs back, and the transition tables enforced."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from pathlib import Path

import pytest

from dynamoctl.plan.build import PlanError
from dynamoctl.supervisor.instance import InstanceName, free_indices
from dynamoctl.supervisor.probes import Health
from dynamoctl.supervisor.supervisor import StartupFailed
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.states import (
    PHASE_TRANSITIONS,
    STATE_TRANSITIONS,
    IllegalTransition,
    Phase,
    RestartReason,
    State,
)
from tests.supervisor.fakes import (
    FakeLauncher,
    FakeProber,
    FakeProcess,
    make_supervisor,
    recipe_text,
    serving,
    until,
)

REPO = Path(__file__).resolve().parents[2]
AGG0 = ("agg-0", "worker", "agg")


def crash(proc: FakeProcess) -> None:
    proc.exit(1)


async def test_restart_budget_spent_leaves_it_failed(tmp_path: Path) -> None:
    async with serving(tmp_path, recipe_text(restart_budget=2)) as h:
        h.launcher.on_start = crash  # every new process of any instance crashes at once
        h.launcher.current("agg-0").exit(1)
        await h.until_state("agg-0", State.FAILED)
        inst = h.sup.instances["agg-0"]
        await until(lambda: inst.task is not None and inst.task.done(), "agg-0's life over")
        assert "restart budget spent (2 restarts in 30 s): not restarting" in inst.message
        assert inst.restarts == 2 and len(h.launcher.started["agg-0"]) == 3
        assert h.sup.restart_counts == {(*AGG0, RestartReason.EXIT): 2}
        await asyncio.sleep(0.3)  # several backoff caps: no further start
        assert len(h.launcher.started["agg-0"]) == 3 and h.state("agg-0") is State.FAILED
        assert h.state("agg-1") is State.READY  # the others are untouched


async def test_backoff_grows_then_resets_after_a_healthy_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dynamoctl.util.backoff.random.uniform", lambda low, high: high)
    delays: list[float] = []
    take = Backoff.next
    monkeypatch.setattr(Backoff, "next", lambda self: delays.append(take(self)) or delays[-1])
    text = recipe_text(budget_window=0.5, restart_budget=100, backoff_cap=1)
    async with serving(tmp_path, text) as h:
        crashes = iter(range(3))
        h.launcher.on_start = lambda proc: next(crashes, None) is not None and proc.exit(1)
        h.launcher.current("agg-0").exit(1)
        await until(lambda: len(h.launcher.started["agg-0"]) == 5, "four restarts")
        assert delays == [0.01, 0.02, 0.04, 0.08]  # consecutive failures: doubling
        await h.until_state("agg-0", State.READY)
        await asyncio.sleep(0.6)  # READY longer than budget_window
        h.launcher.current("agg-0").exit(1)
        await until(lambda: len(delays) == 5, "a fifth failure")
        assert delays[-1] == 0.01  # not 0.16: a healthy window started the delays over
        await h.until_state("agg-0", State.READY)


async def test_worker_whose_tokens_stop_is_killed_as_hung(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        tokens = iter(range(10**6))

        def moving() -> Health:
            count = float(next(tokens))
            return Health(
                True,
                count,
                WorkerHealth(status="ready", inflight=2, kv_usage=0.5, output_tokens=int(count)),
            )

        h.prober.healths["agg-0"] = moving
        await asyncio.sleep(0.4)  # four hang timeouts of progress: left alone
        assert len(h.launcher.started["agg-0"]) == 1
        assert h.sup.status().instances[0].inflight == 2

        stuck = WorkerHealth(status="ready", inflight=2, kv_usage=0.5, output_tokens=7)
        h.prober.healths["agg-0"] = lambda: Health(True, 7.0, stuck)
        first = h.launcher.current("agg-0")
        await until(lambda: first.returncode is not None, "the hung worker killed")
        assert first.signals == [signal.SIGKILL]  # WEDGED: nothing to drain, put down
        assert h.sup.transition_counts[(*AGG0, State.READY, State.WEDGED)] == 1
        del h.prober.healths["agg-0"]
        await until(lambda: len(h.launcher.started["agg-0"]) == 2, "restarted")
        inst = h.sup.instances["agg-0"]
        assert inst.reason is RestartReason.HANG
        assert inst.message == "hung: no token generated for 0.1 s"
        await h.until_state("agg-0", State.READY)
        assert h.sup.restart_counts == {(*AGG0, RestartReason.HANG): 1}


async def test_instance_that_stops_answering_probes_is_killed(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        first = h.launcher.current("agg-1")
        h.prober.healths["agg-1"] = lambda: Health(False)
        await until(lambda: first.returncode is not None, "the silent instance killed")
        del h.prober.healths["agg-1"]
        await until(lambda: h.sup.instances["agg-1"].restarts == 1, "restarted")
        inst = h.sup.instances["agg-1"]
        assert inst.reason is RestartReason.PROBE
        assert inst.message == "hung: answering probes unhealthy for 0.1 s"
        assert h.sup.restart_counts == {("agg-1", "worker", "agg", RestartReason.PROBE): 1}


async def test_drains_spend_no_budget_even_in_backoff(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        assert await h.sup.drain("agg-0") == ["agg-0"]
        await h.until_state("agg-0", State.STOPPED)
        assert h.launcher.started["agg-0"][0].signals == [signal.SIGTERM]

        h.sup.instances["agg-1"].backoff = Backoff(30.0, 30.0)  # a long wait
        h.launcher.current("agg-1").exit(1)
        await h.until_state("agg-1", State.BACKOFF)
        await h.sup.drain("agg-1")
        await h.until_state("agg-1", State.STOPPED, timeout=2)  # no 30 s wait

        await asyncio.sleep(0.1)
        for name in ("agg-0", "agg-1"):
            inst = h.sup.instances[name]
            assert inst.restarts == 0 and len(h.launcher.started[name]) == 1, name
        assert list(h.sup.instances["agg-0"].failures) == []
        assert h.sup.restart_counts == {}


async def test_stop_asked_while_launching_stops_what_was_launched(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        h.launcher.gate = asyncio.Event()
        h.launcher.current("agg-0").exit(1)
        await until(lambda: h.state("agg-0") is State.STARTING, "restart under way")
        drained = asyncio.create_task(h.sup.drain("agg-0"))
        await asyncio.sleep(0.05)
        h.launcher.gate.set()  # the launch returns after the drain was asked
        await drained
        await h.until_state("agg-0", State.STOPPED)
        late = h.launcher.current("agg-0")
        assert late.returncode is not None and late.signals == [signal.SIGTERM]


async def test_scale_up_down_up_gives_gpus_back(tmp_path: Path) -> None:
    async with serving(tmp_path, recipe_text(replicas=2, gpus=2)) as h:
        sup = h.sup
        assert sup.instances["agg-1"].spec.gpus == [1]
        with pytest.raises(PlanError, match="no free GPUs left for another agg replica"):
            await sup.scaling.scale("agg", 3)
        assert "agg-2" not in sup.instances

        assert (await sup.scaling.scale("agg", 1)).drained == ["agg-1"]
        await h.until_state("agg-1", State.STOPPED)
        assert sup.gpu_map.used["localhost"] == {0}

        assert (await sup.scaling.scale("agg", 2)).started == ["agg-1"]
        assert sup.instances["agg-1"].spec.gpus == [1]
        await h.until_state("agg-1", State.READY)
        assert sup.gpu_map.used["localhost"] == {0, 1}
        assert sup.restart_counts == {} and sup.instances["agg-1"].restarts == 0
        with pytest.raises(PlanError, match="no free GPUs"):
            await sup.scaling.scale("agg", 3)
    assert sup.gpu_map.used["localhost"] == set()  # down gave everything back


async def test_failure_while_starting_rolls_back(tmp_path: Path) -> None:
    launcher, prober = FakeLauncher(), FakeProber()
    launcher.on_start = lambda proc: proc.spec.name == "agg-1" and proc.exit(2)
    sup = make_supervisor(tmp_path, recipe_text(), launcher, prober)
    with pytest.raises(StartupFailed, match=r"agg-1 \(worker on localhost\) failed to start"):
        await asyncio.wait_for(sup.run(), 10)
    assert sup.phase is Phase.FAILED and "exited with status 2" in sup.error
    states = {name: inst.state for name, inst in sup.instances.items()}
    assert states == {"agg-0": State.STOPPED, "agg-1": State.FAILED, "frontend-0": State.STOPPED}
    assert len(launcher.started["agg-1"]) == 1  # not retried
    state = sup.run_dir.read_state()
    assert state is not None and state.phase is Phase.FAILED and state.records == {}
    assert "frontend-0" not in launcher.started


async def test_transitions_are_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynamoctl.supervisor.supervisor")
    async with serving(tmp_path) as h:
        h.launcher.current("agg-0").exit(1)
        await until(lambda: h.sup.instances["agg-0"].restarts == 1, "restarted")
        await h.until_state("agg-0", State.READY)
    lines = [r.getMessage() for r in caplog.records]
    assert "agg-0 on localhost: READY -> FAILED (exited with status 1)" in lines
    assert any(re.fullmatch(r"agg-0 on localhost: FAILED -> BACKOFF \(restart in [\d.]+ s\)", m)
               for m in lines)  # fmt: skip
    assert "unit: serving -> stopping (down)" in lines
    counts = h.sup.transition_counts
    assert counts[(*AGG0, State.READY, State.FAILED)] == 1
    assert counts[(*AGG0, State.STARTING, State.READY)] == 2
    assert counts[(*AGG0, State.READY, State.DRAINING)] == 1  # down


async def test_illegal_transitions_fail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup = make_supervisor(tmp_path, recipe_text(), FakeLauncher(), FakeProber())
    inst = sup.instances["agg-0"]
    with pytest.raises(IllegalTransition, match="agg-0 on localhost: PENDING -> READY"):
        sup.transition(inst, State.READY, "test")
    assert inst.state is State.PENDING  # refused in strict mode
    sup.transition(inst, State.STOPPED, "test")
    with pytest.raises(IllegalTransition, match=r"STOPPED -> STARTING .*none: it is final"):
        sup.transition(inst, State.STARTING, "test")
    with pytest.raises(IllegalTransition, match="deployment unit: starting -> stopped"):
        sup._set_phase(Phase.STOPPED)

    sup.strict = False  # production: logged as an error, applied
    sup.transition(inst, State.READY, "test")
    assert inst.state is State.READY
    assert [r.levelname for r in caplog.records if "not allowed" in r.getMessage()] == ["ERROR"]


def test_tables_cover_every_member_and_the_docs_list_the_states() -> None:
    assert set(STATE_TRANSITIONS) == set(State)
    assert set(PHASE_TRANSITIONS) == set(Phase)
    for table in (STATE_TRANSITIONS, PHASE_TRANSITIONS):
        for old, allowed in table.items():
            assert old not in allowed, f"{old} -> {old}"  # no silent self-transitions
    # Everything but PENDING is reachable; STOPPED is reachable from every live state.
    reachable = set().union(*STATE_TRANSITIONS.values())
    assert reachable == set(State) - {State.PENDING}
    ops = (REPO / "docs" / "operations.md").read_text()
    section = ops.split("### Instance states", 1)[1].split("###", 1)[0]
    documented = re.findall(r"^\| ([A-Z]+) \|", section, re.M)
    assert documented == [s.value for s in State]  # status shows exactly these, in order


def test_instance_names() -> None:
    assert str(InstanceName("agg", 10)) == "agg-10"
    assert sorted([InstanceName("agg", 10), InstanceName("agg", 2)])[0].index == 2
    assert free_indices([0, 2], 3) == [1, 3, 4]


async def test_taken_back_instances_are_recorded_before_they_are_watched(tmp_path: Path) -> None:
    """state.json lists an adopted process from the moment it is taken back: a supervisor
    killed again before watching it leaves it adoptable, not orphaned until its grace."""
    from dynamoctl.launch.api import ProcessRecord

    launcher, prober = FakeLauncher(), FakeProber()
    sup = make_supervisor(tmp_path, recipe_text(replicas=1), launcher, prober)
    spec = sup.instances["agg-0"].spec
    taken = FakeProcess(spec, pid=4242)
    sup.instances["agg-0"].adopted = taken
    sup.save()
    state = sup.run_dir.read_state()
    assert state is not None and state.records["agg-0"] == taken.record
    assert isinstance(state.records["agg-0"], ProcessRecord)
    taken.exit(0)
    sup.save()
    state = sup.run_dir.read_state()
    assert state is not None and "agg-0" not in state.records
