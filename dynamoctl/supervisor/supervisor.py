"""The supervision policy: start a plan in order, keep it alive, tear it down in order.

Each instance has a life task: start → wait until ready → monitor → on an unexpected exit
or a hang, FAILED → BACKOFF → start again, within a restart budget. Drains, scale-downs
and ``down`` ask the instance to stop first, so its exit is STOPPED and spends no budget.
Start order is discovery (a managed etcd), routers, workers, the frontend, then the
planner (it scales what is already serving); ``down``
goes the other way, in ``finally`` on every exit path. While ``up`` is still starting, a
failure is not retried: ``up`` rolls back and reports the instance and its log tail,
because a typo in engine arguments would otherwise crash-loop.

Every change of state goes through :meth:`Supervisor.transition` (the phase's through
:meth:`Supervisor._set_phase`), checked against the tables in
:mod:`dynamoctl.wire.states`. The mechanics live beside this module: probes per
component (``probes.py``), a process watched until it ends or must go (``watch.py``),
the restart policy (``restarts.py``), stopping on purpose (``stopping.py``), the bounds on
every await (``deadlines.py``), names and per-instance records (``instance.py``), what
is reported (``report.py``), placement (``plan/``). Those helpers, gangs, scaling and the
metrics see the supervisor through narrow ports (``view.py``); room beyond the
deployment's hosts is the launcher's extra capacity (:mod:`dynamoctl.launch.capacity`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from dynamoctl.discovery import Discovery
from dynamoctl.launch.api import InstanceSpec, Launched, Launcher, LaunchError
from dynamoctl.launch.capacity import extra_capacity
from dynamoctl.plan.build import GpuMap, Plan
from dynamoctl.recipe.models import Recipe, Supervision
from dynamoctl.supervisor.adapters import AdapterControl
from dynamoctl.supervisor.deadlines import (
    CLOSE_DEADLINE_S,
    abandon,
    within,
)
from dynamoctl.supervisor.gang import Gangs
from dynamoctl.supervisor.instance import Failure, Instance
from dynamoctl.supervisor.probes import DeploymentProber, Prober
from dynamoctl.supervisor.report import (
    ControlAccess,
    last_log_line,
    register_control,
    run_state,
    startup_failure,
    status_report,
)
from dynamoctl.supervisor.restarts import Restarts
from dynamoctl.supervisor.rundir import RunDir
from dynamoctl.supervisor.scaling import Scaling
from dynamoctl.supervisor.spares import Spares
from dynamoctl.supervisor.startups import StartHistory, Starts
from dynamoctl.supervisor.stopping import NOW_TIMEOUT, Stops
from dynamoctl.supervisor.view import RestartKey, TransitionKey
from dynamoctl.supervisor.watch import Watch
from dynamoctl.supervisor.wedge import SilenceKey
from dynamoctl.supervisor.withdraw import RecordWithdrawal
from dynamoctl.util.aio import BackgroundTasks
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.control import StatusReport
from dynamoctl.wire.states import (
    PHASE_TRANSITIONS,
    STATE_TRANSITIONS,
    IllegalTransition,
    Phase,
    RestartReason,
    State,
    StateT,
    check_transition,
)

log = logging.getLogger(__name__)

START_ORDER = ("etcd", "router", "worker", "frontend", "planner")


class StartupFailed(Exception):
    """An instance failed while ``up`` was starting the deployment."""


class Supervisor:
    strict = False
    """Raise :class:`IllegalTransition` on a change the tables do not allow (tests set it);
    otherwise it is logged as an error and applied (:meth:`_check` says why)."""

    def __init__(
        self,
        recipe: Recipe,
        recipe_path: str,
        plan: Plan,
        gpu_map: GpuMap,
        launcher: Launcher,
        run_dir: RunDir,
        prober: Prober | None = None,
        access: ControlAccess | None = None,
        adopted: Mapping[str, Launched] | None = None,
    ) -> None:
        self.recipe = recipe
        self.recipe_path = recipe_path
        self.plan = plan
        self.gpu_map = gpu_map
        self.launcher = launcher
        self.run_dir = run_dir
        self.settings: Supervision = recipe.supervision
        keys = recipe.frontend.load_api_keys()  # a named source without a key: ValueError
        self.prober: Prober = prober or DeploymentProber(
            plan.discovery_url,
            plan.namespace,
            plan.model,
            self.settings.probe_interval / 2,
            api_key=keys[0] if keys else None,
            health_timeout=self.settings.probe_timeout,
        )
        self.instances = {spec.name: self.new_instance(spec) for spec in plan.instances}
        self.stops = Stops(self)
        """Stopping on purpose: drains, scale-downs, ``down``."""
        self.watch = Watch(self)
        """Each process probed until it ends or must go."""
        self.restarts = Restarts(self)
        """The restart policy: FAILED, BACKOFF, started again within the budget."""
        self.gangs = Gangs(self)
        """Multi-node replicas: followers live, fail and stop with their leader."""
        self.scaling = Scaling(self)
        """``scale``: replicas added where the plan places them, or drained."""
        self.spares = Spares(self)
        """Warm spares (recipe ``spares``): kept on standby, promoted on scale-up or failure."""
        history = StartHistory.load(run_dir.path.parent.parent)  # the state dir: all runs'
        self.starts = Starts(recipe, plan.model, history)
        """Start-up timing: each start's phases, the history of a model's starts."""
        self.capacity = extra_capacity(launcher, recipe, self.scaling, run_dir.logs)
        """Room beyond the hosts, the launcher's (Slurm: extra jobs, ``target.growth``)."""
        for name, proc in (adopted or {}).items():  # their lives begin at watching
            self.instances[name].adopted = proc
        self.withdrawal = RecordWithdrawal(plan.discovery_url, plan.namespace)
        self.adapters = AdapterControl(recipe, plan.discovery_url, plan.namespace)
        """LoRA adapters in discovery (``dynamoctl lora``; the recipe's, at start)."""
        self.phase = Phase.STARTING
        self.error = ""
        self.access = access or ControlAccess()
        """How commands reach it (written to ``state.json``)."""
        self.on_change: Callable[[], None] = lambda: None
        self._starting = True
        self._down = asyncio.Event()
        self._down_now = False
        self._background = BackgroundTasks()
        self.restart_counts: Counter[RestartKey] = Counter()
        """Restarts since this supervisor started, for ``/metrics``."""
        self.transition_counts: Counter[TransitionKey] = Counter()
        """Instance state changes since this supervisor started, for ``/metrics``."""
        self.silence_counts: Counter[SilenceKey] = Counter()
        """READY instances' probe silences, survived or wedged, for ``/metrics``."""
        self._discovery: Discovery | None = None

    @property
    def starting(self) -> bool:
        """``up`` is still starting the deployment (a failure rolls it back)."""
        return self._starting

    def new_instance(self, spec: InstanceSpec) -> Instance:
        return Instance(spec, Backoff(self.settings.backoff_base, self.settings.backoff_cap))

    def begin(self, specs: Sequence[InstanceSpec]) -> str:
        """Supervise a new replica's instances (a gang's leader first) and start its life;
        the leader's name."""
        for spec in specs:
            self.instances[spec.name] = self.new_instance(spec)
        inst = self.instances[specs[0].name]
        inst.task = asyncio.create_task(self.life(inst), name=f"life-{inst.spec.name}")
        return inst.spec.name

    async def start_process(self, spec: InstanceSpec) -> Launched:
        return await self.launcher.start(spec, self.run_dir.log_of(spec.name))

    # -- the whole deployment ------------------------------------------------------------

    async def run(self) -> None:
        """Start everything, serve until :meth:`request_down`, then tear down."""
        try:
            # Nothing started on failure; adopted instances hold their ports already.
            fresh = [i.spec for i in self.instances.values() if i.adopted is None]
            await self.launcher.preflight(fresh)
        except BaseException as exc:
            self._fail(exc)
            raise
        try:
            for component in START_ORDER:
                group = [i for i in self.instances.values() if i.spec.component == component]
                if component == "worker":  # workers load them as they start
                    await self.adapters.declare_recipe()
                if group:
                    await self._start_group(group)
                    if component == "etcd":
                        await self.prober.reset()  # re-opened against the now running etcd
            self._starting = False
            self._set_phase(Phase.SERVING)
            self.spares.fill()
            if self.access.url:
                lease_ttl = self.recipe.discovery.lease_ttl
                self._discovery = await register_control(self.plan, self.access.url, lease_ttl)
            log.info("serving %s at %s", self.plan.model, self.plan.endpoint)
            await self._down.wait()
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            if self.phase is not Phase.FAILED:
                self._set_phase(Phase.STOPPING, "down")
            if self._discovery is not None:  # before teardown stops a managed etcd
                await within(self._discovery.close(), CLOSE_DEADLINE_S, "control record close")
                self._discovery = None
            await self._teardown(now=self._down_now)
            await self.capacity.close()  # after the teardown drained their replicas
            await self.spares.close()
            if self.phase is Phase.FAILED:
                self.save()  # without the records of what the teardown stopped
            else:
                self._set_phase(Phase.STOPPED)
            for what, closing in (
                ("probes' close", self.prober.close()),
                ("record withdrawal's close", self.withdrawal.close()),
                ("adapters' close", self.adapters.close()),
            ):
                await within(closing, CLOSE_DEADLINE_S, what)

    def _fail(self, exc: BaseException) -> None:
        self.error = str(exc) or type(exc).__name__
        self._set_phase(Phase.FAILED, self.error.splitlines()[0])

    def request_down(self, now: bool = False) -> None:
        self._down_now = self._down_now or now
        self._down.set()

    async def _start_group(self, group: list[Instance]) -> None:
        for inst in group:
            inst.task = asyncio.create_task(self.life(inst), name=f"life-{inst.spec.name}")
        waits = [asyncio.create_task(self._until_ready(inst)) for inst in group]
        try:
            await asyncio.gather(*waits)
        finally:
            for w in waits:
                w.cancel()

    async def _until_ready(self, inst: Instance) -> None:
        ready = asyncio.create_task(inst.ready.wait())
        ended = asyncio.create_task(inst.ended.wait())
        down = asyncio.create_task(self._down.wait())
        try:
            await asyncio.wait({ready, ended, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (ready, ended, down):
                t.cancel()
        if inst.ready.is_set():
            return
        if self._down.is_set():
            raise StartupFailed("stopped while starting")
        raise StartupFailed(startup_failure(inst, self.run_dir.log_of(inst.spec.name)))

    async def _teardown(self, now: bool) -> None:
        """Stop everything, the reverse of the start order, each group in parallel."""
        why = "rollback" if self.phase is Phase.FAILED else "down"
        for component in reversed(START_ORDER):
            group = [i for i in self.instances.values() if i.spec.component == component]
            await asyncio.gather(*(self.stops.stop_instance(i, now, why) for i in group))
        for inst in self.instances.values():
            if inst.task is not None and not inst.task.done():
                abandon(inst.task)

    # -- one instance ---------------------------------------------------------------------

    async def life(self, inst: Instance) -> None:
        """Run ``inst`` until it is stopped on purpose, or fails for good."""
        try:
            while inst.wanted:
                failure = await self._run_once(inst)
                inst.ended.set()
                if inst.wanted:  # a spare takes a failed replica's place at once
                    self.spares.replace(inst)
                if inst.wanted and not await self.restarts.after_failure(inst, failure):
                    return  # stays FAILED
            self.stops.stopped(inst, inst.stop_why)
        finally:
            inst.ended.set()

    async def _run_once(self, inst: Instance) -> Failure:
        """Start one process of ``inst`` and follow it to its end: why it ended, were it
        wanted (the caller ignores that when it was stopped on purpose)."""
        inst.ready.clear()
        inst.ended.clear()
        inst.started_at, inst.ready_since, inst.sample = time.monotonic(), None, None
        proc, inst.adopted = inst.adopted, None
        if proc is not None:
            self.transition(inst, State.STARTING, f"adopted pid {proc.record.pid}")
        else:
            self.transition(inst, State.STARTING, "restart" if inst.restarts else "start")
            inst.clock.launching()
            try:
                proc = await self._launch(inst.spec)
            except LaunchError as exc:
                inst.proc = None
                return RestartReason.LAUNCH, str(exc)
            inst.clock.launched()
        inst.proc = proc
        failure = await self.gangs.launch(inst)  # a gang's followers start with it
        self.save()
        if not inst.wanted:  # asked to stop while it was being launched
            await self.stops.drain(
                inst, proc, NOW_TIMEOUT if self._down_now else None, inst.stop_why
            )
        failure = failure or await self.gangs.watch(inst, self.watch.watch(inst, proc))
        if failure is not None:
            await self.watch.kill(inst, proc, failure)
        inst.last_exit = await proc.wait()
        wedged = inst.state is State.WEDGED  # its followers get no grace either
        await self.gangs.stop(inst, 0.0 if wedged else NOW_TIMEOUT)  # after their leader
        await self.withdrawal.ended(inst.spec)  # routers drop it now, not at lease expiry
        said = last_log_line(self.run_dir.log_of(inst.spec.name))
        ended = f"exited with status {inst.last_exit}" + (f": {said}" if said else "")
        return failure or (RestartReason.EXIT, ended)

    async def _launch(self, spec: InstanceSpec) -> Launched:
        """Start ``spec``'s process; a launch that has not returned when the instance
        should have been ready (its start timeout) is a :class:`LaunchError`."""
        limit = self.starts.timeout(spec.component, spec.pool)
        task = asyncio.ensure_future(self.start_process(spec))
        try:
            await asyncio.wait({task}, timeout=limit)
        finally:
            if not task.done():  # also when this life is cancelled: what starts late stops
                abandon(task)
        if not task.done():
            raise LaunchError(f"{spec.name}: its launch on {spec.host} took over {limit:g} s")
        return task.result()

    # -- state changes --------------------------------------------------------------------

    def transition(self, inst: Instance, new: State, why: str) -> None:
        """The one place an instance's state changes: checked, logged, counted, notified."""
        spec, old = inst.spec, inst.state
        self._check(STATE_TRANSITIONS, old, new, f"{spec.name} on {spec.host}")
        inst.state = new
        log.info("%s on %s: %s -> %s (%s)", spec.name, spec.host, old, new, why)
        self.transition_counts[(spec.name, spec.component, spec.pool, old, new)] += 1
        self.gangs.mirror(inst, new, why)
        self.changed()

    def _set_phase(self, new: Phase, why: str = "") -> None:
        """The one place the deployment's phase changes: checked, logged, saved."""
        old = self.phase
        self._check(PHASE_TRANSITIONS, old, new, f"deployment {self.plan.name}")
        self.phase = new
        log.info("%s: %s -> %s%s", self.plan.name, old, new, f" ({why})" if why else "")
        self.save()

    def _check(
        self, table: Mapping[StateT, frozenset[StateT]], old: StateT, new: StateT, what: str
    ) -> None:
        try:
            check_transition(table, old, new, what)
        except IllegalTransition as exc:
            if self.strict:
                raise
            # Applied anyway: the new state is what happened to a process (it exited, it
            # was stopped). Refusing would leave status showing something false, and the
            # loop, which reads the state, could wait forever on a change already made.
            log.error("%s; applied anyway (a supervisor bug)", exc, stack_info=True)

    # -- commands -----------------------------------------------------------------------

    def select(self, target: str) -> list[Instance]:
        """Instances named ``target``, or every instance of pool ``target``; a gang's
        follower stands for its leader (a gang is stopped as one)."""
        if target in self.instances:
            return self.gangs.leaders([self.instances[target]])
        return self.gangs.leaders(i for i in self.instances.values() if i.spec.pool == target)

    async def drain(self, target: str, why: str = "drain") -> list[str]:
        chosen = [i for i in self.select(target) if i.wanted]
        if not chosen:
            raise KeyError(f"no running instance or pool named {target!r}")
        for inst in chosen:
            self._background.spawn(self.stops.stop_instance(inst, False, why))
        await asyncio.sleep(0)
        return [i.spec.name for i in chosen]

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> StatusReport:
        report = status_report(
            self.plan, self.phase, self.instances.values(), self.prober.discovery()
        )
        report.growth = self.capacity.status()
        report.measured_start_s = self.starts.measured()
        return report

    def changed(self) -> None:
        self.on_change()

    def save(self) -> None:
        self.run_dir.write_state(
            run_state(
                self.plan,
                self.recipe_path,
                self.phase,
                self.instances.values(),
                control=self.access.url,
                token=self.access.token,
                slurm_job=self.access.slurm_job,
                error=self.error,
            )
        )
        self.changed()
