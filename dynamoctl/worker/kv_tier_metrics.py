"""Per-tier KV cache series on the worker's ``/metrics``: usage, offloads, onboards and
hits of each tier (GPU, host, disk) of engines that know them
(:class:`~dynamoctl.engines.api.ReportsKvTiers`: the mocker; docs/metrics.md).

Read at scrape time from the engines, like the rest of the worker's series.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.engines.api import ReportsKvTiers
from dynamoctl.worker.instance import WorkerInstance

_LABELS = ["instance", "name", "model", "role", "tier"]
_GAUGES = {
    "kv_tier_blocks": "KV blocks held in the tier (GPU: its prefix cache).",
    "kv_tier_capacity_blocks": "KV capacity of the tier in blocks.",
    "kv_tier_hit_rate": "Prompt blocks found in the tier / prompt blocks looked up, since start.",
    "kv_tier_full": "1 while offload into the tier is stopped because its storage is full.",
}
_COUNTERS = {
    "kv_offloaded_blocks": "Blocks written into the tier (GPU: registered in its prefix cache).",
    "kv_onboarded_blocks": "Blocks loaded from the tier into GPU memory.",
    "kv_tier_hit_blocks": "Prompt blocks found in the tier when a request was admitted.",
    "kv_lookup_blocks": "Prompt blocks looked up when requests were admitted.",
    "kv_offload_skipped_full_blocks": "Blocks not written to the tier because it was full.",
}


class KvTierCollector(Collector):
    """``dynamoctl_worker_kv_*`` series with a ``tier`` label (``gpu``, ``host``, ``disk``)."""

    def __init__(self, instances: Sequence[WorkerInstance]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        gauges = {
            n: GaugeMetricFamily(f"dynamoctl_worker_{n}", doc, labels=_LABELS)
            for n, doc in _GAUGES.items()
        }
        counters = {
            n: CounterMetricFamily(f"dynamoctl_worker_{n}", doc, labels=_LABELS)
            for n, doc in _COUNTERS.items()
        }
        for inst in self.instances:
            engine = inst.engine
            if not isinstance(engine, ReportsKvTiers):
                continue
            base = [inst.instance_id, inst.label or inst.instance_id, engine.model_card.model]
            for stats in engine.kv_tier_stats():
                labels = [*base, inst.role, stats.tier.name.lower()]
                lookups = stats.lookup_blocks
                gauge_values = {
                    "kv_tier_blocks": stats.used_blocks,
                    "kv_tier_capacity_blocks": stats.capacity_blocks,
                    "kv_tier_hit_rate": stats.hit_blocks / lookups if lookups else 0.0,
                    "kv_tier_full": int(stats.full),
                }
                counter_values = {
                    "kv_offloaded_blocks": stats.offloaded_blocks,
                    "kv_onboarded_blocks": stats.onboarded_blocks,
                    "kv_tier_hit_blocks": stats.hit_blocks,
                    "kv_lookup_blocks": lookups,
                    "kv_offload_skipped_full_blocks": stats.skipped_full_blocks,
                }
                for name, value in gauge_values.items():
                    gauges[name].add_metric(labels, float(value))
                for name, value in counter_values.items():
                    counters[name].add_metric(labels, float(value))
        yield from gauges.values()
        yield from counters.values()
