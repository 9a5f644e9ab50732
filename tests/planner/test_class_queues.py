"""The planner sees the frontends' per-class admission queues (issue 31): parsed from
``/metrics``, carried into each pool's metrics, shown in its own ``/metrics``, and a
queue at the frontends forbids a scale-down (every worker is busy for those requests)."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import generate_latest

from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.tenants.metrics import KeyMetrics
from dynamoctl.planner.decide import decide_load
from dynamoctl.planner.observe import COUNTERS, FrontendTotals, WorkerLoad, parse_totals, window
from dynamoctl.planner.records import PlannerState, PoolState
from dynamoctl.planner.service import pool_metrics
from dynamoctl.planner.settings import PlannerSettings
from dynamoctl.wire.engine import LoadMetrics
from tests.planner.helpers import metrics, model, spec

pytestmark = pytest.mark.planner


def test_per_class_queues_reach_the_pools_metrics() -> None:
    frontend = FrontendMetrics()
    keys = KeyMetrics(frontend.registry)  # the same registry, as the frontend serves it
    keys.queued.labels("interactive").inc(3)
    keys.queued.labels("batch").inc(5)
    keys.queued.labels("batch").dec(1)
    keys.queued.labels("idle").inc(0)
    frontend.received.labels("m").inc()
    text = generate_latest(frontend.registry).decode()
    after = parse_totals(text, 12.0, model="m")
    assert after.queued == {"interactive": 3, "batch": 4, "idle": 0}
    span = window(FrontendTotals(at=10.0, **dict.fromkeys(COUNTERS, 0.0)), after)
    assert span is not None and span.queued == after.queued
    load = LoadMetrics(active_blocks=1, total_blocks=10, num_waiting=0, num_running=1,
                       prefill_tokens_queued=0, kv_usage=0.1)  # fmt: skip
    pools = pool_metrics(["agg"], {"agg": 1}, [WorkerLoad("agg", "agg-0", load, 11.0)], span)
    assert pools["agg"].frontend_queued == {"interactive": 3, "batch": 4}


def test_requests_queued_at_the_frontends_forbid_a_scale_down() -> None:
    settings = PlannerSettings(itl_target_ms=15.0, gpu_budget=16)
    specs = [spec("prefill"), spec("decode")]
    current = PlannerState(pools={"prefill": PoolState(target=1), "decode": PoolState(target=4)})
    idle = metrics(100.0, 4, kv=0.1)
    for queued, expected in (({}, 3), ({"batch": 7, "interactive": 1}, 4)):
        load = {
            "decode": msgspec.structs.replace(idle, frontend_queued=queued),
            "prefill": metrics(100.0, 1),
        }
        state = current
        for step in range(3):  # a scale-down needs stable intervals
            now = 100.0 + settings.load_interval * step
            load = {role: msgspec.structs.replace(m, at=now) for role, m in load.items()}
            decision, state = decide_load(
                settings=settings, specs=specs, state=state, model=model(), load=load, now=now
            )
        assert state.pools["decode"].target == expected, decision.pools[1].reason
    assert "requests queued at the frontends (batch 7, interactive 1)" in decision.pools[1].reason
