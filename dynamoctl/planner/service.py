"""The running planner: every ``load_interval`` it reads the deployment (the supervisor's
status, the workers' load streams, the frontends' latencies), runs the loops its mode
asks for (:mod:`dynamoctl.planner.decide`), logs each decision with its inputs and reason,
and applies the changes through the supervisor (docs/planner.md, "The running planner").

Missing data holds: no supervisor, no frontend scrape, a pool with nothing ready or a
ready replica whose load never arrived gives that pool no metrics, and ``decide_load``
then holds it (never a scale-down on missing data)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec

from dynamoctl.discovery import Discovery, DiscoveryError
from dynamoctl.planner import budget
from dynamoctl.planner.apply import SupervisorLink, pool_counts
from dynamoctl.planner.decide import decide_load, decide_throughput
from dynamoctl.planner.observe import (
    FrontendScrape,
    FrontendTotals,
    LoadWatch,
    Window,
    WorkerLoad,
    window,
)
from dynamoctl.planner.perf import PerfModel
from dynamoctl.planner.predict import TrafficForecaster
from dynamoctl.planner.records import (
    Decision,
    Forecast,
    Loop,
    PlannerState,
    PoolMetrics,
    PoolSpec,
    TrafficSample,
)
from dynamoctl.planner.settings import PlannerOptions
from dynamoctl.settings.component import Role
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.control import StatusReport
from dynamoctl.wire.planner import PlannerPhase, PlannerPool, PlannerStatus
from dynamoctl.wire.roles import DECODE_ROLES, PREFILL_ROLES
from dynamoctl.wire.start_phases import PROMOTE_TIMEOUT_S
from dynamoctl.wire.states import State

log = logging.getLogger(__name__)

DecisionKey = tuple[str, str, str]
"""(loop, pool, action) of a decision, for ``/metrics``."""


def pool_specs(options: PlannerOptions) -> list[PoolSpec]:
    """The pools the planner scales, with their bounds; :class:`budget.BudgetError` when
    their minimums alone exceed the budget."""
    settings = options.planner
    specs = [
        PoolSpec(
            role=role,
            gpus_per_replica=gpus,
            min_replicas=settings.bounds(role)[0],
            max_replicas=settings.bounds(role)[1],
        )
        for role, gpus in options.pools.gpus().items()
    ]
    if not specs:
        raise ValueError("no pool to scale: give --agg-gpus, or --prefill-gpus and --decode-gpus")
    budget.check_budget(specs, settings.gpu_budget)
    return specs


def pool_metrics(
    roles: list[Role], ready: dict[Role, int], workers: list[WorkerLoad], span: Window | None
) -> dict[Role, PoolMetrics]:
    """Each pool's metrics from its workers' latest load and the frontends' window; a pool
    whose data is incomplete is left out, so that the load loop holds it: no window (the
    latencies unknown, silence would read as idle), nothing READY, or a READY replica
    whose load has not arrived."""
    if span is None:
        return {}
    metrics = {}
    for role in roles:
        samples = [w for w in workers if w.role == role]
        count = ready.get(role, 0)
        if count == 0 or len({w.label for w in samples}) < count:
            continue
        metrics[role] = PoolMetrics(
            at=min(w.at for w in samples),  # the oldest: one silent worker makes it stale
            ready=count,
            queued_prefill_tokens=sum(w.metrics.prefill_tokens_queued for w in samples),
            kv_usage=sum(w.metrics.kv_usage for w in samples) / len(samples),
            ttft=span.ttft if role in PREFILL_ROLES else None,
            itl=span.itl if role in DECODE_ROLES else None,
            inflight=sum(w.metrics.num_waiting + w.metrics.num_running for w in samples),
            frontend_queued={k: round(v) for k, v in span.queued.items() if v > 0},
            arrival_rate=span.requests / span.seconds,
            mean_isl=span.mean_isl,
            mean_osl=span.mean_osl,
            startup_s=max(
                (w.metrics.startup_s for w in samples if w.metrics.startup_s is not None),
                default=None,
            ),
        )
    return metrics


class PlannerService:
    """The planner's state between decisions and what it shows (status, metrics)."""

    def __init__(
        self,
        options: PlannerOptions,
        discovery: Discovery,
        model: PerfModel | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = options.planner
        self.specs = pool_specs(options)
        self.roles: list[Role] = [spec.role for spec in self.specs]
        self.model = model
        self.clock = clock
        namespace, served = options.namespace, options.pools.model
        self.load = LoadWatch(discovery, namespace, served)
        self.frontend = FrontendScrape(discovery, namespace, served)
        self.link = SupervisorLink(discovery, namespace, Backoff(0.5, 10.0))
        self.forecaster = TrafficForecaster(self.settings.predictor, self.settings.predictor_window)
        self.phase: PlannerPhase = "waiting"
        self.state: PlannerState | None = None
        self.ready: dict[Role, int] = {}
        self.metrics: dict[Role, PoolMetrics] = {}
        self.window: Window | None = None
        """The frontends' last load window."""
        self.sample: TrafficSample | None = None
        self.forecast: Forecast | None = None
        self.last: Decision | None = None
        self.latest: dict[Loop, Decision] = {}
        """Each loop's latest decision (a pool is budget-bound if either says so)."""
        self.last_change = ""
        self.decisions: Counter[DecisionKey] = Counter()
        self._load_mark: FrontendTotals | None = None
        self._throughput_mark: FrontendTotals | None = None

    async def start(self) -> None:
        await self.load.start()

    async def close(self) -> None:
        await self.link.close()
        await self.load.close()
        await self.frontend.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Decide every ``load_interval`` until ``stop``."""
        interval = self.settings.load_interval
        while not stop.is_set():
            began = self.clock()
            try:
                await self.tick()
            except Exception:  # one bad interval must not end the planner: it holds
                log.exception("planner interval failed; holding until the next")
            left = interval - (self.clock() - began)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(left, 0.0))

    async def tick(self) -> None:
        """One interval: observe, decide, apply."""
        report = await self.link.status()
        if report is None:
            self.phase = "waiting"
            return
        wanted, self.ready = pool_counts(report, self.roles)
        if self.state is None:  # the deployment's counts are where the planner starts
            self.state = PlannerState.start(wanted)
            log.info("planning %s from %s", self.settings.mode, _counts(wanted))
        self.phase = "planning"
        totals = await self._observe()
        self._measured_startup(report.measured_start_s)
        self._spares(report)
        now = self.clock()
        if self.settings.mode != "load":
            self.throughput(totals, now)
        if self.settings.mode != "throughput":
            decision, self.state = decide_load(
                settings=self.settings,
                specs=self.specs,
                state=self.state,
                model=self.model,
                load=self.metrics,
                now=now,
            )
            self._apply(decision)

    def _measured_startup(self, measured: dict[str, float]) -> None:
        """Each pool's start-up as the supervisor measured it (launch to ready: the median
        of the model's recent starts on the pool's kind of node), where it is longer than
        what the replicas report of themselves or they report nothing (real engines)."""
        for role, pool in self.metrics.items():
            figures = [s for s in (pool.startup_s, measured.get(role)) if s is not None]
            if figures:
                self.metrics[role] = msgspec.structs.replace(pool, startup_s=max(figures))

    def _spares(self, report: StatusReport) -> None:
        """Each pool's warm spares on standby and how long promoting one takes (the longest
        promotion of the pool ``status`` shows, else the supervisor's promotion bound)."""
        for role, pool in self.metrics.items():
            rows = [r for r in report.instances if r.pool == role and r.component == "worker"]
            spares = sum(1 for r in rows if r.state is State.STANDBY and not r.rank)
            if not spares:
                continue
            took = [r.start.promotion_s for r in rows if r.start and r.start.promotion_s]
            promotion = max(took, default=PROMOTE_TIMEOUT_S)
            self.metrics[role] = msgspec.structs.replace(pool, spares=spares, promotion_s=promotion)

    async def _observe(self) -> FrontendTotals | None:
        """Refresh :attr:`metrics` (pools with usable metrics only) and :attr:`window`."""
        self.metrics, self.window = {}, None
        try:
            await self.load.refresh()
            totals = await self.frontend.totals()
        except DiscoveryError as exc:
            log.warning("discovery unreachable (%s): holding", exc)
            return None
        if totals is not None and self._load_mark is not None:
            self.window = window(self._load_mark, totals)
        self._load_mark = totals
        self.metrics = pool_metrics(self.roles, self.ready, self.load.workers(), self.window)
        return totals

    def throughput(self, totals: FrontendTotals | None, now: float) -> None:
        """The throughput loop, once ``throughput_interval`` has passed since the last."""
        assert self.state is not None
        mark = self._throughput_mark
        if mark is not None and now - mark.at < self.settings.throughput_interval:
            return
        if totals is not None:
            self._throughput_mark = totals
        if mark is None:
            return  # the first mark: the first interval starts here
        span = window(mark, totals) if totals is not None else None
        self.sample = None if span is None else self._traffic(span, now)
        if self.sample is not None:
            self.forecaster.observe(self.sample)
        self.forecast = self.forecaster.forecast()
        decision, self.state = decide_throughput(
            settings=self.settings,
            specs=self.specs,
            state=self.state,
            model=self.model,
            forecast=self.forecast,
            observed=self.sample,
            now=now,
        )
        self._apply(decision)

    def _traffic(self, span: Window, now: float) -> TrafficSample:
        decoders = [w for w in self.load.workers() if w.role in DECODE_ROLES]
        batch = sum(w.metrics.num_running for w in decoders) / len(decoders) if decoders else None
        return TrafficSample(
            at=now,
            interval=span.seconds,
            requests=round(span.requests),
            mean_isl=span.mean_isl,
            mean_osl=span.mean_osl,
            ttft=span.ttft,
            itl=span.itl,
            decode_batch=batch,
        )

    def _apply(self, decision: Decision) -> None:
        """Log ``decision`` with its inputs, count it, and ask the supervisor for its changes."""
        self.last = self.latest[decision.loop] = decision
        for pool in decision.pools:
            self.decisions[(decision.loop, pool.role, pool.action)] += 1
        changes = decision.changes
        moves = ", ".join(
            f"{p.role} {p.current} -> {p.desired}" for p in decision.pools if p.role in changes
        )
        log.log(
            # Every change, and every throughput decision (minutes apart), at INFO.
            logging.INFO if changes or decision.loop == "throughput" else logging.DEBUG,
            "%s loop: %s; gpus %d/%d; inputs %s; %s",
            decision.loop,
            moves or "hold",
            decision.gpus,
            decision.budget,
            self._inputs(decision),
            decision.reason,
        )
        if changes:
            self.last_change = moves
        for role, replicas in changes.items():
            self.link.scale(role, replicas)

    def _inputs(self, decision: Decision) -> str:
        if decision.loop == "throughput":
            return msgspec.json.encode(
                {
                    "forecast": decision.forecast,
                    "observed": decision.observed,
                    "lead_s": decision.lead_s,
                }
            ).decode()
        return msgspec.json.encode(decision.load or {}).decode()

    def status(self) -> PlannerStatus:
        """What ``/health`` answers and ``dynamoctl status`` shows."""
        last, state = self.last, self.state
        pools = []
        for spec in self.specs:
            pool = state.pools[spec.role] if state is not None else None
            decided = next((p for p in last.pools if p.role == spec.role), None) if last else None
            bound = any(
                p.budget_bound for d in self.latest.values() for p in d.pools if p.role == spec.role
            )
            pools.append(
                PlannerPool(
                    role=spec.role,
                    desired=pool.target if pool is not None else 0,
                    ready=self.ready.get(spec.role, 0),
                    floor=pool.floor if pool is not None else 0,
                    budget_bound=bound,
                    reason=decided.reason if decided is not None else "",
                )
            )
        targets = {role: pool.target for role, pool in state.pools.items()} if state else {}
        return PlannerStatus(
            phase=self.phase,
            mode=self.settings.mode,
            pools=pools,
            gpus=budget.units(self.specs, targets),
            budget=self.settings.gpu_budget,
            last_loop=last.loop if last is not None else "",
            last_decision_age_s=self.clock() - last.at if last is not None else None,
            last_change=self.last_change,
            reason=last.reason if last is not None else _waiting(self.phase),
            budget_bound=any(d.budget_bound for d in self.latest.values()),
            scale_error=self.link.error,
        )


def _waiting(phase: PlannerPhase) -> str:
    return "waiting for the supervisor's control endpoint" if phase == "waiting" else ""


def _counts(counts: dict[Role, int]) -> str:
    return ", ".join(f"{role}={count}" for role, count in counts.items())
