"""The worker process's HTTP side: ``/metrics`` (Prometheus), ``/health``, ``/live``.

Metrics are read from the instances at scrape time by a collector, so nothing on the
request path updates gauges. One process may host several instances (``--num-workers``):
every series carries an ``instance`` label.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from dynamoctl.engines.api import ReportsStalls, ReportsStartup
from dynamoctl.planes.curve import RefusalCollector
from dynamoctl.wire.health import HealthStatus, WorkerHealth
from dynamoctl.wire.model_cache import StagingReport
from dynamoctl.worker.instance import WorkerInstance
from dynamoctl.worker.kv_tier_metrics import KvTierCollector
from dynamoctl.worker.staging_metrics import StagingCollector
from dynamoctl.worker.startup_metrics import StartupCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ["instance", "name", "model", "role"]
"""``name``: the worker's name in ``dynamoctl status`` (``agg-1``), its instance id outside
a supervised deployment; dashboards show it."""


class WorkerCollector(Collector):
    """Prometheus series for every instance of this process (names in docs/metrics.md)."""

    def __init__(self, instances: Sequence[WorkerInstance]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "kv_usage": "Fraction of KV blocks held by requests.",
            "kv_active_blocks": "KV blocks held by requests.",
            "kv_total_blocks": "KV cache capacity in blocks.",
            "kv_cached_blocks": "Blocks in the prefix cache (published KV state).",
            "requests_waiting": "Requests queued in the engine, not yet scheduled.",
            "requests_running": "Requests the engine is prefilling or decoding.",
            "prefill_tokens_queued": "Prompt tokens accepted but not yet prefilled.",
            "inflight_requests": "Request-plane streams open on this instance.",
            "draining": "1 while the instance drains.",
        }
        families = {
            name: GaugeMetricFamily(f"dynamoctl_worker_{name}", doc, labels=_LABELS)
            for name, doc in gauges.items()
        }
        requests = CounterMetricFamily(
            "dynamoctl_worker_requests", "Requests received.", labels=_LABELS
        )
        tokens = CounterMetricFamily(
            "dynamoctl_worker_output_tokens", "Tokens generated.", labels=_LABELS
        )
        prompt = CounterMetricFamily(
            "dynamoctl_worker_prompt_tokens",
            "Prompt tokens of the requests started (as the engine reports on the first chunk).",
            labels=_LABELS,
        )
        cached = CounterMetricFamily(
            "dynamoctl_worker_cached_tokens",
            "Prompt tokens not computed here: prefix-cache hits, and KV pulled from a prefill.",
            labels=_LABELS,
        )
        remote = CounterMetricFamily(
            "dynamoctl_worker_remote_prefilled_requests",
            "Requests that arrived with a prefill worker's KV hand-off.",
            labels=_LABELS,
        )
        for inst in self.instances:
            name = inst.label or inst.instance_id
            labels = [inst.instance_id, name, inst.engine.model_card.model, inst.role]
            load = inst.engine.load_metrics()
            values = {
                "kv_usage": load.kv_usage,
                "kv_active_blocks": load.active_blocks,
                "kv_total_blocks": load.total_blocks,
                "kv_cached_blocks": len(inst.kv_state),
                "requests_waiting": load.num_waiting,
                "requests_running": load.num_running,
                "prefill_tokens_queued": load.prefill_tokens_queued,
                "inflight_requests": inst.inflight,
                "draining": int(inst.draining),
            }
            for name, value in values.items():
                families[name].add_metric(labels, float(value))
            requests.add_metric(labels, inst.requests_total)
            tokens.add_metric(labels, inst.tokens_total)
            prompt.add_metric(labels, inst.prompt_tokens_total)
            cached.add_metric(labels, inst.cached_tokens_total)
            remote.add_metric(labels, inst.remote_prefilled_total)
        yield from families.values()
        yield from (requests, tokens, prompt, cached, remote)


def worker_health(
    instances: Sequence[WorkerInstance], ready: bool, staging: StagingReport | None = None
) -> WorkerHealth:
    """The process's ``/health``: its state, and what tells a hung engine from a busy one."""
    status: HealthStatus = "ready" if ready else "starting"
    if ready and any(inst.standby for inst in instances):
        status = "standby"
    if any(inst.draining for inst in instances):
        status = "draining"
    usage = [inst.engine.load_metrics().kv_usage for inst in instances]
    starting = [i.engine for i in instances if isinstance(i.engine, ReportsStartup)]
    return WorkerHealth(
        status=status,
        instances=[inst.instance_id for inst in instances],
        inflight=sum(inst.inflight for inst in instances),
        kv_usage=sum(usage) / len(usage) if usage else 0.0,
        output_tokens=sum(inst.tokens_total for inst in instances),
        startup=starting[0].startup_report() if starting else None,
        staging=staging,
        stalled_s=max(
            (i.engine.stalled_for() for i in instances if isinstance(i.engine, ReportsStalls)),
            default=0.0,
        ),
        adapters=sorted({a for i in instances if i.adapters for a in i.adapters.loaded}),
    )


def build_app(
    instances: Sequence[WorkerInstance],
    ready: list[bool],
    staging: list[StagingReport] | None = None,
) -> Starlette:
    """``ready[0]`` flips to True once every instance has registered; ``staging`` gets
    the model cache's report once the weights are staged."""
    staged: list[StagingReport] = staging if staging is not None else []
    registry = CollectorRegistry()
    registry.register(StagingCollector(staged))  # model.cache
    registry.register(WorkerCollector(instances))
    registry.register(KvTierCollector(instances))  # engines that know their KV tiers
    registry.register(StartupCollector(instances))  # engines that simulate their start-up
    registry.register(RefusalCollector())  # peers the planes' CURVE refused

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    async def health(_: Request) -> Response:
        report = worker_health(instances, ready[0], staged[0] if staged else None)
        status = 200 if report.status == "ready" else 503
        return Response(msgspec.json.encode(report), status, media_type="application/json")

    async def live(_: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/health", health),
            Route("/live", live),
        ]
    )
