"""The model cache's staging on the worker's ``/metrics`` (docs/metrics.md): how long the
weights took to stage before the engine started, and where the engine reads them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.wire.model_cache import StagingReport


class StagingCollector(Collector):
    """``dynamoctl_worker_model_staging_seconds`` and ``..._staging_bytes`` (labelled by
    ``weights_from``: ``cache`` or ``shared``, and ``hit``), once staged."""

    def __init__(self, staged: Sequence[StagingReport]) -> None:
        self.staged = staged

    def collect(self) -> Iterator[Metric]:
        labels = ["weights_from", "hit"]
        seconds = GaugeMetricFamily(
            "dynamoctl_worker_model_staging_seconds",
            "Seconds staging the weights into the node's model cache took before the "
            "engine started (0 on a hit).",
            labels=labels,
        )
        copied = GaugeMetricFamily(
            "dynamoctl_worker_model_staging_bytes",
            "Bytes this worker's staging read from the shared path.",
            labels=labels,
        )
        for report in self.staged[:1]:
            values = [report.weights_from, str(report.hit).lower()]
            seconds.add_metric(values, report.staging_s)
            copied.add_metric(values, float(report.bytes_copied))
        yield seconds
        yield copied
