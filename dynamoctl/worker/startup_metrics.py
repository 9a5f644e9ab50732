"""Start-up series on the worker's ``/metrics`` for engines that simulate their start-up
(:class:`~dynamoctl.engines.api.ReportsStartup`: the mocker; docs/metrics.md): the phase,
the seconds so far and expected, the weight bytes read. Read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import get_args

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.engines.api import ReportsStartup
from dynamoctl.wire.health import StartupPhase
from dynamoctl.worker.instance import WorkerInstance

_LABELS = ["instance", "name", "model", "role"]
_GAUGES = {
    "startup_elapsed_seconds": "Engine seconds since start-up began (all of it once ready).",
    "startup_expected_seconds": "Engine seconds the whole start-up takes (weights + init).",
    "startup_weights_bytes": "Weight bytes the replica reads at start.",
    "startup_loaded_bytes": "Weight bytes read so far.",
}


class StartupCollector(Collector):
    """``dynamoctl_worker_startup_*`` series, and ``dynamoctl_worker_startup_phase`` (1 on
    the current phase: ``weights``, ``init``, ``ready``)."""

    def __init__(self, instances: Sequence[WorkerInstance]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        gauges = {
            n: GaugeMetricFamily(f"dynamoctl_worker_{n}", doc, labels=_LABELS)
            for n, doc in _GAUGES.items()
        }
        phase = GaugeMetricFamily(
            "dynamoctl_worker_startup_phase",
            "1 on the engine's current start-up phase (weights, init, ready).",
            labels=[*_LABELS, "phase"],
        )
        for inst in self.instances:
            engine = inst.engine
            if not isinstance(engine, ReportsStartup):
                continue
            report = engine.startup_report()
            labels = [inst.instance_id, inst.label or inst.instance_id]
            labels += [engine.model_card.model, inst.role]
            values = {
                "startup_elapsed_seconds": report.elapsed_s,
                "startup_expected_seconds": report.expected_s,
                "startup_weights_bytes": report.weights_bytes,
                "startup_loaded_bytes": report.loaded_bytes,
            }
            for name, value in values.items():
                gauges[name].add_metric(labels, float(value))
            for name in get_args(StartupPhase):
                phase.add_metric([*labels, name], float(name == report.phase))
        yield from gauges.values()
        yield phase
