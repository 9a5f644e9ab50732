"""The planner process's HTTP side: ``/metrics`` (Prometheus, read from the planner at
scrape time; names in docs/metrics.md) and ``/health`` (its
:class:`~dynamoctl.wire.planner.PlannerStatus` as JSON, which the supervisor's probe reads
for ``dynamoctl status``)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dynamoctl.planner.service import PlannerService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "dynamoctl_planner_"


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(_PREFIX + name, doc, labels=labels)


def _value(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_PREFIX + name, doc, value=value)


class PlannerCollector(Collector):
    def __init__(self, planner: PlannerService) -> None:
        self.planner = planner

    def collect(self) -> Iterator[Metric]:
        planner = self.planner
        status = planner.status()
        pool = ["pool"]
        desired = _gauge("desired_replicas", "Replicas the planner asks for.", pool)
        ready = _gauge("ready_replicas", "Replicas the supervisor reports READY.", pool)
        floor = _gauge("floor_replicas", "The throughput loop's floor.", pool)
        bound = _gauge(
            "budget_bound", "1 while the targets need more than the GPU budget leaves.", pool
        )
        kv = _gauge("observed_kv_usage", "Mean KV usage of the pool's replicas.", pool)
        queued = _gauge("observed_prefill_queue_tokens", "Prompt tokens queued in the pool.", pool)
        waiting = _gauge(
            "observed_frontend_queued_requests",
            "Requests waiting in the frontends' admission queues, by priority class.",
            ["class"],
        )
        for klass, count in (planner.window.queued if planner.window else {}).items():
            waiting.add_metric([klass], count)
        for row in status.pools:
            desired.add_metric([row.role], row.desired)
            ready.add_metric([row.role], row.ready)
            floor.add_metric([row.role], row.floor)
            bound.add_metric([row.role], float(row.budget_bound))
        for role, metrics in planner.metrics.items():
            kv.add_metric([role], metrics.kv_usage)
            queued.add_metric([role], metrics.queued_prefill_tokens)
        yield from (desired, ready, floor, bound, kv, queued, waiting)
        yield _value("gpus", "Budget units the desired replicas hold.", status.gpus)
        yield _value("gpu_budget", "The GPU budget.", status.budget)
        ttft = _gauge("observed_ttft_seconds", "Mean TTFT over the last load interval.", [])
        itl = _gauge("observed_itl_seconds", "Mean ITL over the last load interval.", [])
        window = planner.window  # no sample while nothing was measured
        if window is not None and window.ttft is not None:
            ttft.add_metric([], window.ttft)
        if window is not None and window.itl is not None:
            itl.add_metric([], window.itl)
        yield ttft
        yield itl
        series = ["series"]
        predicted = _gauge("predicted_load", "Forecast of the next throughput interval.", series)
        observed = _gauge("observed_load", "The last throughput interval.", series)
        if planner.forecast is not None:
            predicted.add_metric(["request_rate"], planner.forecast.rate)
            predicted.add_metric(["isl"], planner.forecast.isl)
            predicted.add_metric(["osl"], planner.forecast.osl)
        if planner.sample is not None:
            sample = planner.sample
            observed.add_metric(["request_rate"], sample.requests / sample.interval)
            observed.add_metric(["isl"], sample.mean_isl)
            observed.add_metric(["osl"], sample.mean_osl)
        yield predicted
        yield observed
        decisions = CounterMetricFamily(
            _PREFIX + "decisions", "Decisions per loop, pool and action (up, down, hold).",
            labels=["loop", "pool", "action"],
        )  # fmt: skip
        for key, count in sorted(planner.decisions.items()):
            decisions.add_metric(list(key), count)
        yield decisions
        failures = CounterMetricFamily(
            _PREFIX + "scale_failures", "Scale requests that failed (each is retried).", labels=pool
        )
        for failed, count in sorted(planner.link.failures.items()):
            failures.add_metric([failed], count)
        yield failures


def build_app(planner: PlannerService, registered: list[bool]) -> Starlette:
    """``registered[0]`` flips to True once the planner's record is in discovery."""
    registry = CollectorRegistry()
    registry.register(PlannerCollector(planner))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    async def health(_: Request) -> Response:
        status = planner.status()
        if not registered[0]:
            status = msgspec.structs.replace(status, phase="starting")
        body = msgspec.json.encode(status)
        return Response(body, 200 if registered[0] else 503, media_type="application/json")

    return Starlette(routes=[Route("/metrics", metrics), Route("/health", health)])
