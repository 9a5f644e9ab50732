"""The supervisor's own Prometheus series, served on the control endpoint's ``/metrics``.

Read from the supervisor at scrape time, like the worker's: nothing on the supervision
path updates a gauge. Restarts and state changes are counted by the supervisor, not by the
instance, so a name that a scale-down and scale-up re-create keeps monotonic counters.
Names and labels are in docs/metrics.md.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamoctl.supervisor.view import MetricsView
from dynamoctl.wire.start_phases import (
    MEASURED_START_SECONDS,
    SPARE_PROMOTION_SECONDS,
    SPARE_PROMOTIONS,
    START_PHASE_SECONDS,
)
from dynamoctl.wire.states import SUPERVISOR_PHASES, GrowthState, State

_INSTANCE = ["deployment", "instance", "component", "role"]


class _Series:
    """One scrape's series, empty until filled from the supervisor."""

    def __init__(self) -> None:
        self.restarts = CounterMetricFamily(
            "dynamoctl_supervisor_restarts",
            "Instance restarts by the supervisor, by reason.",
            labels=[*_INSTANCE, "reason"],
        )
        self.state = GaugeMetricFamily(
            "dynamoctl_supervisor_instance_state",
            "1 for the instance's current state, 0 for the others.",
            labels=[*_INSTANCE, "state"],
        )
        self.by_state = GaugeMetricFamily(
            "dynamoctl_supervisor_instances",
            "Instances in each state.",
            labels=["deployment", "state"],
        )
        self.budget = GaugeMetricFamily(
            "dynamoctl_supervisor_restart_budget_left",
            "Restarts the instance may still spend within the budget window.",
            labels=_INSTANCE,
        )
        self.uptime = GaugeMetricFamily(
            "dynamoctl_supervisor_instance_uptime_seconds",
            "Seconds since the instance's current process started (0 when none runs).",
            labels=_INSTANCE,
        )
        self.transitions = CounterMetricFamily(
            "dynamoctl_supervisor_transitions",
            "Instance state changes, by the state left and the state entered.",
            labels=[*_INSTANCE, "from_state", "to_state"],
        )
        self.phase = GaugeMetricFamily(
            "dynamoctl_supervisor_phase",
            "1 for the deployment's current phase, 0 for the others.",
            labels=["deployment", "phase"],
        )
        self.silences = CounterMetricFamily(
            "dynamoctl_supervisor_probe_silences",
            "READY instances' probes that got no answer at all, by outcome: survived (it "
            "answered again within wedge_timeout) or wedged (put down).",
            labels=[*_INSTANCE, "outcome"],
        )
        self.growth = GaugeMetricFamily(
            "dynamoctl_supervisor_growth_jobs",
            "Extra Slurm jobs beyond the allocation, in each state.",
            labels=["deployment", "state"],
        )
        self.phases = GaugeMetricFamily(
            START_PHASE_SECONDS,
            "Seconds of each phase of the instance's last start (staging, process, ready, "
            "total; promotion for a promoted warm spare).",
            labels=[*_INSTANCE, "phase"],
        )
        self.measured = GaugeMetricFamily(
            MEASURED_START_SECONDS,
            "Median seconds from launch to ready of the recent starts of a model on a kind "
            "of node (the history in the state directory).",
            labels=["deployment", "model", "node_kind"],
        )
        self.promotions = CounterMetricFamily(
            SPARE_PROMOTIONS, "Warm spares promoted to READY, by why.", labels=["deployment", "why"]
        )
        self.promotion_s = GaugeMetricFamily(
            SPARE_PROMOTION_SECONDS,
            "Seconds the instance's last promotion from warm spare took, asked to READY.",
            labels=_INSTANCE,
        )

    def in_order(self) -> tuple[Metric, ...]:
        """The series in the order they are exposed."""
        return (
            *(self.restarts, self.state, self.by_state, self.budget, self.uptime),
            *(self.transitions, self.silences, self.phase, self.growth, self.phases),
            *(self.measured, self.promotions, self.promotion_s),
        )


class SupervisorCollector(Collector):
    """Series for every instance the supervisor knows, and the deployment's phase."""

    def __init__(self, supervisor: Callable[[], MetricsView] | None) -> None:
        self.supervisor = supervisor
        """Gives the supervisor at scrape time; None: describe the series only (docs test)."""

    def collect(self) -> Iterator[Metric]:
        series = _Series()
        sup = self.supervisor() if self.supervisor is not None else None
        if sup is not None:
            _fill_instances(series, sup)
            _fill_counts(series, sup)
        yield from series.in_order()


def _fill_instances(series: _Series, sup: MetricsView) -> None:
    """Each instance's state, budget, uptime and last start; instances per state."""
    name, now = sup.plan.name, time.monotonic()
    settings = sup.settings
    counted: Counter[State] = Counter()
    for inst in sup.instances.values():
        labels = [name, inst.spec.name, inst.spec.component, inst.spec.pool]
        counted[inst.state] += 1
        for each in State:
            series.state.add_metric([*labels, str(each)], float(inst.state is each))
        recent = sum(1 for t in inst.failures if t >= now - settings.budget_window)
        series.budget.add_metric(labels, float(max(0, settings.restart_budget - recent)))
        running = inst.proc is not None and inst.proc.returncode is None
        up = now - inst.started_at if running and inst.started_at else 0.0
        series.uptime.add_metric(labels, up)
        last = inst.clock.last
        for phase_name, seconds in (last.by_phase() if last else {}).items():
            if phase_name == "promotion":
                series.promotion_s.add_metric(labels, seconds)
            else:
                series.phases.add_metric([*labels, phase_name], seconds)
    for each in State:
        series.by_state.add_metric([name, str(each)], float(counted[each]))


def _fill_counts(series: _Series, sup: MetricsView) -> None:
    """The deployment's counters, phase, start history, promotions and extra jobs."""
    name = sup.plan.name
    for (instance, component, role, reason), n in sorted(sup.restart_counts.items()):
        series.restarts.add_metric([name, instance, component, role, str(reason)], float(n))
    for (instance, component, role, old, new), n in sorted(sup.transition_counts.items()):
        labels = [name, instance, component, role, str(old), str(new)]
        series.transitions.add_metric(labels, float(n))
    for (instance, component, role, outcome), n in sorted(sup.silence_counts.items()):
        series.silences.add_metric([name, instance, component, role, outcome], float(n))
    for each_phase in SUPERVISOR_PHASES:
        series.phase.add_metric([name, str(each_phase)], float(sup.phase is each_phase))
    for (model, kind), seconds in sorted(sup.starts.history.by_key().items()):
        series.measured.add_metric([name, model, kind], seconds)
    for why, n in sorted(sup.spares.promotions.items()):
        series.promotions.add_metric([name, why], float(n))
    jobs = Counter(job.state for job in sup.capacity.status())
    for each_growth in GrowthState:
        series.growth.add_metric([name, str(each_growth)], float(jobs[each_growth]))
