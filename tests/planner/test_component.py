"""The planner as a component, without a deployment: its recipe section's rules, its flags
and place in the plan, what it reads from the frontends' metrics, how it counts pools in a
status report, and that it holds, retries and reports when what it needs is missing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest

from dynamoctl.cli.view import planner_line
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.plan.build import build_plan
from dynamoctl.planner.apply import SupervisorLink, pool_counts
from dynamoctl.planner.http import PlannerCollector
from dynamoctl.planner.observe import (
    COUNTERS,
    FrontendTotals,
    Window,
    WorkerLoad,
    parse_totals,
    window,
)
from dynamoctl.planner.perf import PerfModel
from dynamoctl.planner.records import PlannerState, PoolMetrics
from dynamoctl.planner.service import PlannerService, pool_metrics
from dynamoctl.planner.settings import PlannerOptions, PlannerPools, PlannerSettings
from dynamoctl.recipe import load_recipe_text
from dynamoctl.recipe.issues import RecipeError
from dynamoctl.recipe.models import Recipe
from dynamoctl.security import names
from dynamoctl.settings import flag
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.control import InstanceStatus, StatusReport
from dynamoctl.wire.engine import LoadMetrics
from dynamoctl.wire.records import Component, Endpoint, InstanceRecord, encode_json
from dynamoctl.wire.start_phases import PROMOTE_TIMEOUT_S, StartPhases
from dynamoctl.wire.states import Phase, State
from tests.planner.helpers import PROFILE

pytestmark = pytest.mark.planner

DISAGG = """\
schema: 1
name: planned
model: {name: tiny, path: tiny}
workers:
  prefill: {engine: mocker, gpus_per_replica: 1, replicas: 1}
  decode: {engine: mocker, gpus_per_replica: 2, replicas: 1}
target: {kind: local, gpus: 8}
"""


def disagg(planner: str) -> Recipe:
    return load_recipe_text(DISAGG + "planner:\n" + planner, "p.yaml")


def refused(text: str, recipe: str = DISAGG) -> str:
    with pytest.raises(RecipeError) as err:
        load_recipe_text(recipe + "planner:\n" + text, "p.yaml")
    return str(err.value)


def test_the_section_is_checked_against_the_pools_and_the_budget(tmp_path: Path) -> None:
    # Minimums 1 x 1 + 1 x 2 GPUs do not fit in 2.
    assert "p.yaml:9 planner.gpu_budget: prefill_min_replicas 1 x 1 + decode_min_replicas" in (
        refused("  gpu_budget: 2")
    )
    # Starting replicas over the budget: the planner could not keep it.
    many = DISAGG.replace("replicas: 1}\n  decode", "replicas: 4}\n  decode")
    assert "hold 6 GPUs at start" in refused("  gpu_budget: 5", many)
    # A knob of a pool the deployment lacks is not silently ignored.
    assert "planner.agg_max_replicas: the deployment has no agg pool" in refused(
        "  agg_max_replicas: 3"
    )
    assert "planner.mode: throughput needs a profile" in refused("  mode: throughput")
    assert "planner.profile" in refused(f"  profile: {tmp_path / 'none.json'}")
    # A profile measured for another model, engine or replica size: every difference named.
    other = tmp_path / "other.json"
    other.write_bytes(msgspec.json.encode(PROFILE))  # model "tiny", 1 GPU per replica
    message = refused(f"  profile: {other}")
    assert "gpus_per_replica 1 (the pool's is 2)" in message
    recipe = disagg("  gpu_budget: 8\n  mode: both")
    assert recipe.planner is not None and recipe.planner.gpu_budget == 8


def test_every_knob_is_a_flag_and_the_plan_renders_the_section(tmp_path: Path) -> None:
    text = subprocess.run(
        [sys.executable, "-m", "dynamoctl", "planner", "--help"],
        capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        check=True, timeout=60,
    ).stdout  # fmt: skip
    for model in (PlannerSettings, PlannerPools):
        for name in model.model_fields:
            assert flag(model, name) in text, name
    recipe = disagg("  ttft_target_ms: 250.0\n  gpu_budget: 6\n  cooldown: 4.0")
    plan, _ = build_plan(recipe, tmp_path)
    assert [spec.name for spec in plan.instances][-2:] == ["frontend-0", "planner-0"]
    spec = plan.by_pool("planner")[0]
    argv = spec.argv[spec.argv.index("planner") + 1 :]
    assert spec.component == "planner" and names.CONTROL_TOKEN in spec.secrets
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    assert options["--ttft-target-ms"] == "250.0" and options["--cooldown"] == "4.0"
    assert (options["--prefill-gpus"], options["--decode-gpus"]) == ("1", "2")
    assert "--agg-gpus" not in options and options["--model"] == "tiny"


def test_frontend_counters_make_a_window() -> None:
    metrics = FrontendMetrics()
    for _ in range(3):  # three arrive, two end: a backlog of one
        metrics.received.labels("m").inc()
    metrics.input_tokens.labels("m").inc(3000)
    for ttft in (0.1, 0.3):
        metrics.ttft.labels("m").observe(ttft)
        metrics.requests.labels("m", "completions", "200").inc()
    metrics.itl.labels("m").observe(0.02)
    metrics.output_tokens.labels("m").inc(40)
    metrics.ttft.labels("other").observe(9.0)  # another model's: not ours
    metrics.requests.labels("m", "completions", "400").inc()  # refused: never generated
    metrics.requests.labels("", "chat", "404").inc()
    text = generate_latest(metrics.registry).decode()
    before = FrontendTotals(at=10.0, **dict.fromkeys(COUNTERS, 0.0))
    after = parse_totals(text, 12.0, model="m")
    assert (after.received, after.requests, after.ttft_count) == (3, 2, 2)
    span = window(before, after)
    assert span is not None
    # The rate and prompt lengths are those of arrivals, output lengths those of ends.
    assert (span.seconds, span.requests, span.mean_isl, span.mean_osl) == (2.0, 3, 1000, 20)
    assert span.ttft == pytest.approx(0.2) and span.itl == pytest.approx(0.02)
    assert window(after, before) is None  # counters went back: a restarted frontend
    assert parse_totals(text, 12.0).ttft_count == 3  # no model: every model's
    assert parse_totals(text, 12.0).requests == 2  # the refused are not ends


def _row(name: str, pool: str, state: State, rank: int = 0) -> InstanceStatus:
    return InstanceStatus(
        name=name, pool=pool, component="worker", host="h", pid=1, state=state,
        restarts=0, uptime_s=1.0, rank=rank,
    )  # fmt: skip


def test_pool_counts_skip_drained_and_followers() -> None:
    report = StatusReport(
        name="n", phase=Phase.SERVING, endpoint="e", model="m", target="local",
        instances=[
            _row("decode-0", "decode", State.READY),
            _row("decode-0-1", "decode", State.READY, rank=1),  # a gang's follower
            _row("decode-1", "decode", State.STARTING),
            _row("decode-2", "decode", State.DRAINING),
            _row("prefill-0", "prefill", State.STOPPED),
        ],
    )  # fmt: skip
    wanted, ready = pool_counts(report, ["prefill", "decode"])
    assert wanted == {"prefill": 0, "decode": 2} and ready == {"prefill": 0, "decode": 1}


def _options(tmp_path: Path) -> PlannerOptions:
    return PlannerOptions(
        namespace="ns",
        discovery=f"embedded://{tmp_path}",
        pools=PlannerPools(agg_gpus=0, model="m"),
        planner=PlannerSettings(load_interval=0.1, gpu_budget=2, agg_max_replicas=2),
    )


def exported(collector: PlannerCollector) -> dict[str, str]:
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in collector.collect()
    }


def documented_planner_metrics() -> dict[str, str]:
    """name -> type of the planner's rows in docs/metrics.md."""
    rows = {}
    for line in (Path(__file__).parents[2] / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`dynamoctl_planner_"):
            rows[cells[0].strip("`")] = cells[2]
    return rows


def test_without_a_supervisor_it_waits_and_says_so(tmp_path: Path) -> None:
    async def run() -> None:
        async with Discovery(store_from_url(f"embedded://{tmp_path}")) as discovery:
            planner = PlannerService(_options(tmp_path), discovery, None)
            await planner.start()
            try:
                await planner.tick()
                status = planner.status()
                assert status.phase == "waiting" and "control endpoint" in status.reason
                assert status.pools[0].desired == 0 and planner.link.failures == {}
                text = planner_line(status)
                assert text.startswith("planner (both, waiting)")
                assert documented_planner_metrics() == exported(PlannerCollector(planner))
            finally:
                await planner.close()

    asyncio.run(run())


def test_a_failed_scale_is_retried_with_backoff_and_reported(tmp_path: Path) -> None:
    async def run() -> None:
        async with Discovery(store_from_url(f"embedded://{tmp_path}")) as discovery:
            dead = "http://127.0.0.1:9"  # discard port: nothing answers
            record = InstanceRecord(
                instance_id="planned", component=Component.SUPERVISOR,
                endpoint=Endpoint.CONTROL, address=dead, host="h", pid=1,
            )  # fmt: skip
            key = keys.instance_key("ns", Component.SUPERVISOR, Endpoint.CONTROL, "planned")
            await discovery.register(key, encode_json(record))
            link = SupervisorLink(discovery, "ns", Backoff(0.05, 0.1))
            try:
                assert await link.status() is None  # unreachable: the planner holds
                link.scale("agg", 2)
                for _ in range(100):
                    if link.failures["agg"] >= 3:
                        break
                    await asyncio.sleep(0.05)
                assert link.failures["agg"] >= 3 and link.pending("agg")
                assert link.error.startswith("scale agg=2 failed: supervisor at")
                assert "retrying in" in link.error
            finally:
                await link.close()

    asyncio.run(run())


def test_status_json_carries_the_planner_line() -> None:
    from dynamoctl.wire.planner import PlannerPool, PlannerStatus

    status = PlannerStatus(
        phase="planning", mode="load", gpus=3, budget=3, budget_bound=True,
        pools=[PlannerPool(role="agg", desired=3, ready=2, floor=1, budget_bound=True)],
        last_loop="load", last_decision_age_s=1.2, last_change="agg 2 -> 3",
        reason="agg: TTFT 900 ms > target 200 ms; budget-bound: gpu_budget 3 is spent [x]",
    )  # fmt: skip
    report = StatusReport(
        name="n", phase=Phase.SERVING, endpoint="e", model="m", target="local", instances=[],
        planner=status,
    )  # fmt: skip
    decoded = msgspec.json.decode(msgspec.json.encode(report), type=StatusReport)
    assert decoded.planner == status
    assert json.loads(msgspec.json.encode(report))["planner"]["budget_bound"] is True
    line = planner_line(status)
    assert "agg 2/3 ready/desired" in line and "budget-bound" in line
    assert "last change agg 2 -> 3" in line and "\\[x]" in line  # reasons are not markup


def _load(role: str, label: str, at: float, queued: int = 0, kv: float = 0.0) -> WorkerLoad:
    metrics = LoadMetrics(
        active_blocks=0, total_blocks=1, num_waiting=0, num_running=1,
        prefill_tokens_queued=queued, kv_usage=kv,
    )  # fmt: skip
    return WorkerLoad(role=role, label=label, metrics=metrics, at=at)


def test_incomplete_data_leaves_a_pool_out_so_it_holds() -> None:
    span = Window(seconds=1.0, requests=4, mean_isl=100, mean_osl=10, ttft=0.3, itl=0.02)
    workers = [
        _load("prefill", "prefill-0", 5.0, queued=100),
        _load("prefill", "prefill-1", 3.0, queued=50),
        _load("decode", "decode-0", 5.0, kv=0.5),
    ]
    ready = {"prefill": 2, "decode": 2}
    metrics = pool_metrics(["prefill", "decode"], ready, workers, span)
    # decode-1 is READY but its load never came: decode is left out (held), not scaled
    # as if its one reporting replica were the whole pool.
    assert set(metrics) == {"prefill"}
    prefill = metrics["prefill"]
    assert (prefill.ready, prefill.queued_prefill_tokens, prefill.at) == (2, 150, 3.0)
    assert (prefill.ttft, prefill.itl) == (0.3, None)  # TTFT is the prefill pool's signal
    assert pool_metrics(["prefill", "decode"], ready, workers, None) == {}  # no latencies
    assert pool_metrics(["decode"], {"decode": 0}, workers, span) == {}  # nothing READY
    agg = pool_metrics(["agg"], {"agg": 1}, [_load("agg", "agg-0", 1.0, kv=0.9)], span)["agg"]
    assert (agg.ttft, agg.itl, agg.kv_usage) == (0.3, 0.02, 0.9)
    assert (prefill.inflight, prefill.startup_s) == (2, None)  # one running on each


def test_a_pool_s_start_up_is_the_longest_its_replicas_reported() -> None:
    span = Window(seconds=1.0, requests=4, mean_isl=100, mean_osl=10, ttft=0.3, itl=0.02)
    workers = [_load("agg", "agg-0", 1.0), _load("agg", "agg-1", 1.0)]
    workers[0] = WorkerLoad(
        role="agg", label="agg-0", at=1.0,
        metrics=msgspec.structs.replace(workers[0].metrics, startup_s=46.0, num_waiting=3),
    )  # fmt: skip
    agg = pool_metrics(["agg"], {"agg": 2}, workers, span)["agg"]
    assert (agg.startup_s, agg.inflight) == (46.0, 5)


def _totals(at: float, arrived: float, ended: float) -> FrontendTotals:
    return FrontendTotals(
        at=at, received=arrived, requests=ended, input_tokens=arrived * 1000,
        output_tokens=ended * 100, ttft_sum=0.0, ttft_count=0.0, itl_sum=0.0, itl_count=0.0,
    )  # fmt: skip


def test_the_throughput_loop_raises_the_floor_from_the_frontends_counters(tmp_path: Path) -> None:
    options = PlannerOptions(
        namespace="ns",
        discovery=f"embedded://{tmp_path}",
        pools=PlannerPools(agg_gpus=1, model="tiny"),
        planner=PlannerSettings(
            throughput_interval=10.0, predictor="constant", agg_max_replicas=8, gpu_budget=8
        ),
    )

    async def run() -> None:
        async with Discovery(store_from_url(f"embedded://{tmp_path}")) as discovery:
            planner = PlannerService(options, discovery, PerfModel(PROFILE))
            planner.state = PlannerState.start({"agg": 1})
            try:
                planner.throughput(_totals(0.0, 0, 0), now=0.0)  # the first mark
                assert planner.last is None
                planner.throughput(_totals(5.0, 10, 10), now=5.0)  # not due yet
                assert planner.last is None
                # 10 s: 50 arrived (5 req/s of 1000-token prompts), 40 ended (100 tokens).
                planner.throughput(_totals(10.0, 50, 40), now=10.0)
                assert planner.sample is not None and planner.forecast is not None
                assert (planner.sample.requests, planner.sample.mean_isl) == (50, 1000)
                assert planner.forecast.rate == 5.0 and planner.forecast.osl == 100
                decision = planner.last
                assert decision is not None and decision.loop == "throughput"
                floor = decision.pools[0].floor
                assert floor > 1 and planner.state.pools["agg"].target == floor
                assert planner.link.pending("agg")  # asked of the supervisor (none here)
            finally:
                await planner.close()

    asyncio.run(run())


def test_spares_on_standby_and_their_promotion_reach_the_pool_s_metrics(tmp_path: Path) -> None:
    def row(name: str, state: State, promotion_s: float | None = None) -> InstanceStatus:
        start = StartPhases(total_s=40.0, promotion_s=promotion_s)
        return msgspec.structs.replace(_row(name, "agg", state), start=start)

    def spares_seen(rows: list[InstanceStatus]) -> PoolMetrics:
        async def run() -> PoolMetrics:
            async with Discovery(store_from_url(f"embedded://{tmp_path}")) as discovery:
                planner = PlannerService(_options(tmp_path), discovery, None)
                planner.metrics = {"agg": PoolMetrics(at=0.0, ready=1, startup_s=40.0)}
                report = StatusReport(
                    name="n", phase=Phase.SERVING, endpoint="e", model="m", target="local",
                    instances=rows,
                )  # fmt: skip
                planner._spares(report)
                return planner.metrics["agg"]

        return asyncio.run(run())

    promoted = row("agg-0", State.READY, promotion_s=0.3)  # a spare promoted earlier
    seen = spares_seen([promoted, row("agg-1", State.STANDBY), row("agg-2", State.STANDBY)])
    assert (seen.spares, seen.promotion_s) == (2, 0.3)
    assert seen.lead_s(40.0) == seen.lead_s(40.0, replicas=2) == 0.3
    assert seen.lead_s(40.0, replicas=3) == 40.0  # more than the spares: cold starts
    never = spares_seen([row("agg-0", State.READY), row("agg-1", State.STANDBY)])
    assert (never.spares, never.promotion_s) == (1, PROMOTE_TIMEOUT_S)
    none = spares_seen([row("agg-0", State.READY)])
    assert (none.spares, none.promotion_s, none.lead_s(40.0)) == (0, None, 40.0)
