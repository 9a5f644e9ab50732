"""Start-up timing and the warm spares' pieces that need no deployment: the history of
starts, the start timeout it gives, a spare's command line, its states, and what the
planner counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamoctl.launch.api import InstanceSpec
from dynamoctl.planner.apply import pool_counts
from dynamoctl.recipe import RecipeError, load_recipe_text
from dynamoctl.supervisor.instance import STANDBY_FLAG, as_spare
from dynamoctl.supervisor.startups import (
    KEEP,
    StartClock,
    StartHistory,
    staged_seconds,
    start_timeout,
)
from dynamoctl.wire.control import InstanceStatus, StatusReport
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.model_cache import StagingReport
from dynamoctl.wire.states import STATE_TRANSITIONS, State

pytestmark = pytest.mark.fast_start


def test_history_keeps_the_last_starts_per_model_and_kind_across_loads(tmp_path: Path) -> None:
    history = StartHistory.load(tmp_path)
    assert history.median("m", "local:mocker:0gpu") is None
    for seconds in [50.0, 40.0, 46.0]:
        history.add("m", "local:mocker:0gpu", seconds)
    history.add("m", "slurm:vllm:8gpu", 300.0)
    again = StartHistory.load(tmp_path)  # persisted: a new deployment reads it
    assert again.median("m", "local:mocker:0gpu") == 46.0
    assert again.by_key() == {("m", "local:mocker:0gpu"): 46.0, ("m", "slurm:vllm:8gpu"): 300.0}
    for _ in range(KEEP):  # bounded: old starts leave
        again.add("m", "slurm:vllm:8gpu", 10.0)
    assert StartHistory.load(tmp_path).median("m", "slurm:vllm:8gpu") == 10.0


def test_unreadable_history_starts_anew(tmp_path: Path) -> None:
    (tmp_path / "start_history.json").write_text("{not json")
    history = StartHistory.load(tmp_path)
    assert history.starts == {}
    history.add("m", "k", 3.0)
    assert json.loads((tmp_path / "start_history.json").read_text()) == {"m|k": [3.0]}


def test_start_timeout_uses_the_measured_figure_only_when_asked() -> None:
    assert start_timeout(600.0, None, 46.0) == 600.0  # not asked
    assert start_timeout(600.0, 3.0, None) == 600.0  # nothing measured yet
    assert start_timeout(600.0, 3.0, 46.0) == 138.0
    assert start_timeout(600.0, 3.0, 2.0) == 30.0  # a floor for a fast model


def test_start_clock_phases_add_up() -> None:
    clock = StartClock(staging_s=5.0)
    clock.launching()
    clock.launched()
    total = clock.ready()
    last = clock.last
    assert last is not None and total is not None
    assert last.staging_s == 5.0 and last.process_s is not None and last.ready_s is not None
    assert total >= 5.0 and last.total_s == round(total, 3)
    assert set(last.by_phase()) == {"staging", "process", "ready", "total"}
    clock.promotion_asked = 0.0
    assert clock.promoted() > 0 and "promotion" in last.by_phase()


def test_a_worker_s_own_staging_is_its_staging_phase_and_not_counted_twice() -> None:
    """The node model cache stages inside the worker, after launch: the staging its
    ``/health`` reports is the staging phase, out of ``ready_s``, and the total is the
    wall time from launch (not launch-to-ready plus the staging again)."""
    report = StagingReport(weights_from="cache", path="/c/m", staging_s=2.5, hit=False)
    sample = WorkerHealth(status="ready", staging=report)
    assert staged_seconds(sample) == 2.5
    assert staged_seconds(WorkerHealth(status="ready")) is None and staged_seconds(None) is None
    clock = StartClock()
    clock.launching()
    assert clock.launch_at is not None
    clock.launched()
    assert clock.launched_at is not None
    # launched 10 s ago, running for 9.9 s, of which the worker staged for 2.5 s
    clock.launch_at -= 10.0
    clock.launched_at -= 9.9
    total = clock.ready(staged_seconds(sample))
    last = clock.last
    assert last is not None and total is not None
    assert last.staging_s == 2.5 and last.ready_s is not None and 7.3 < last.ready_s < 8.5
    assert 10.0 <= total < 11.0


def test_a_spare_is_its_command_line() -> None:
    spec = InstanceSpec(
        name="agg-1", pool="agg", component="worker", host="localhost",
        argv=["python", "-m", "dynamoctl", "worker", "--label", "agg-1", "--num-gpu-blocks", "8"],
    )  # fmt: skip
    spare = as_spare(spec, True)
    assert spare.argv[:5] == ["python", "-m", "dynamoctl", "worker", STANDBY_FLAG]
    assert as_spare(spare, True).argv == spare.argv  # once
    assert as_spare(spare, False).argv == spec.argv


def test_standby_states() -> None:
    assert State.STANDBY in STATE_TRANSITIONS[State.STARTING]
    assert STATE_TRANSITIONS[State.STANDBY] == {
        State.READY, State.FAILED, State.WEDGED, State.DRAINING, State.STOPPED,
    }  # fmt: skip
    assert State.STANDBY not in STATE_TRANSITIONS[State.READY]  # a replica is never a spare


def test_the_planner_counts_no_spare() -> None:
    def row(name: str, state: State) -> InstanceStatus:
        return InstanceStatus(
            name=name, pool="agg", component="worker", host="h", pid=1, state=state,
            restarts=0, uptime_s=1.0,
        )  # fmt: skip

    report = StatusReport(
        name="d", phase="serving", endpoint="e", model="m", target="local",
        instances=[row("agg-0", State.READY), row("agg-1", State.STANDBY)],
    )  # fmt: skip
    assert pool_counts(report, ["agg"]) == ({"agg": 1}, {"agg": 1})


RECIPE = """\
schema: 1
name: s
model: {name: m, path: m}
target: {kind: slurm, partition: p, nodes: 2}
workers:
  agg: {engine: mocker, replicas: 1, gpus_per_replica: 0, nodes_per_replica: 2, spares: 1}
"""


def test_spares_of_a_multi_node_replica_are_refused() -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(RECIPE, "r.yaml")
    assert "workers.agg.spares" in str(caught.value)
    assert "multi-node replica has no spares" in str(caught.value)
    assert "would hold 2 whole nodes idle" in str(caught.value)  # why, with its size


def test_the_planner_takes_the_longer_of_the_measured_and_reported_start_up() -> None:
    from types import SimpleNamespace

    from dynamoctl.planner.records import PoolMetrics
    from dynamoctl.planner.service import PlannerService

    service = SimpleNamespace(
        metrics={
            "agg": PoolMetrics(at=0.0, ready=1),  # a real engine reports none
            "prefill": PoolMetrics(at=0.0, ready=1, startup_s=60.0),
            "decode": PoolMetrics(at=0.0, ready=1, startup_s=20.0),
        }
    )
    PlannerService._measured_startup(service, {"agg": 46.0, "decode": 46.0})  # type: ignore[arg-type]
    assert {r: m.startup_s for r, m in service.metrics.items()} == {
        "agg": 46.0, "prefill": 60.0, "decode": 46.0,
    }  # fmt: skip
