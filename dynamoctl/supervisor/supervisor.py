"""The supervisor loop: start a plan in order, keep it alive, tear it down in order.

Each instance has a life task: start → wait until ready → monitor → on an unexpected exit
or a hang, FAILED → BACKOFF → start again, within a restart budget. Drains, scale-downs
and ``down`` clear the instance's ``wanted`` flag first, so its exit is STOPPED and spends
no budget. Start order is discovery (a managed etcd), workers, then the frontend; ``down``
goes the other way. While ``up`` is still starting, a failure is not retried: ``up`` rolls
back and reports the instance and its log tail, because a typo in engine arguments would
otherwise crash-loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.launch.api import InstanceSpec, Launched, Launcher, LaunchError, stop
from dynamoctl.recipe.models import Recipe, Role, Supervision
from dynamoctl.supervisor.health import Probes, WorkerSample
from dynamoctl.supervisor.metrics import RestartKey, RestartReason
from dynamoctl.supervisor.plan import GpuMap, Plan, PlanError, worker_spec
from dynamoctl.supervisor.rundir import RunDir, RunState
from dynamoctl.supervisor.states import State
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.control import InstanceStatus, ScaleReply, StatusReport

log = logging.getLogger(__name__)

START_ORDER = ("etcd", "router", "worker", "frontend")
NOW_TIMEOUT = 3.0
"""Seconds ``down --now`` gives each instance between SIGTERM and SIGKILL."""


class StartupFailed(Exception):
    """An instance failed while ``up`` was starting the deployment."""


@dataclass
class Instance:
    spec: InstanceSpec
    state: State = State.PENDING
    proc: Launched | None = None
    wanted: bool = True
    restarts: int = 0
    failures: deque[float] = field(default_factory=deque)
    reason: RestartReason = "exit"
    """Why the last process ended unexpectedly (the restart counter's label)."""
    started_at: float | None = None
    last_exit: int | None = None
    message: str = ""
    sample: WorkerSample | None = None
    released: bool = False
    """Its GPUs went back to the map (it was stopped on purpose)."""
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    def __init__(
        self,
        recipe: Recipe,
        recipe_path: str,
        plan: Plan,
        gpu_map: GpuMap,
        launcher: Launcher,
        run_dir: RunDir,
    ) -> None:
        self.recipe = recipe
        self.recipe_path = recipe_path
        self.plan = plan
        self.gpu_map = gpu_map
        self.launcher = launcher
        self.run_dir = run_dir
        self.settings: Supervision = recipe.supervision
        self.instances = {spec.name: Instance(spec) for spec in plan.instances}
        self.phase = "starting"
        self.error = ""
        self.control_url = ""
        self.token = ""
        self.slurm_job = ""
        self.on_change: Callable[[], None] = lambda: None
        self._starting = True
        self._down = asyncio.Event()
        self._down_now = False
        self._probes: Probes | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.restart_counts: Counter[RestartKey] = Counter()
        """Restarts since this supervisor started, for ``/metrics``."""
        self._discovery: Discovery | None = None

    # -- the whole deployment ------------------------------------------------------------

    async def run(self) -> None:
        """Start everything, serve until :meth:`request_down`, then tear down."""
        await self.launcher.preflight(self.plan.instances)  # nothing started on failure
        try:
            for component in START_ORDER:
                group = [i for i in self.instances.values() if i.spec.component == component]
                if group:
                    await self._start_group(group)
                    if component == "etcd" and self._probes is not None:
                        await self._probes.close()  # re-opened against the now running etcd
                        self._probes = None
            self._starting = False
            self.phase = "serving"
            self.save()
            await self._register()
            log.info("serving %s at %s", self.plan.model, self.plan.endpoint)
            await self._down.wait()
        except BaseException as exc:
            self.phase, self.error = "failed", str(exc)
            raise
        finally:
            if self.phase != "failed":
                self.phase = "stopping"
            self.save()
            if self._discovery is not None:  # before teardown stops a managed etcd
                await self._discovery.close()
                self._discovery = None
            await self._teardown(now=self._down_now)
            if self.phase != "failed":
                self.phase = "stopped"
            self.save()
            if self._probes is not None:
                await self._probes.close()

    async def _register(self) -> None:
        """Put the control endpoint in discovery as ``{ns}/instances/supervisor/control/NAME``
        so that Prometheus targets generated from discovery include its ``/metrics``. Best
        effort: the deployment serves without it."""
        if not self.control_url:
            return
        record = wire.InstanceRecord(
            instance_id=self.plan.name,
            component="supervisor",
            endpoint="control",
            address=self.control_url,
            host=socket.gethostname(),
            pid=os.getpid(),
            model=self.plan.model,
            metrics_url=f"{self.control_url}/metrics",
        )
        key = keys.instance_key(self.plan.namespace, "supervisor", "control", self.plan.name)
        disc = Discovery(
            store_from_url(self.plan.discovery_url),
            lease_ttl=self.recipe.discovery.lease_ttl,
            connect_timeout=10.0,
        )
        try:
            await disc.start()
            await disc.register(key, wire.encode_json(record))
        except Exception as exc:
            log.warning("could not register the control endpoint in discovery: %s", exc)
            await disc.close()
            return
        self._discovery = disc

    def request_down(self, now: bool = False) -> None:
        self._down_now = self._down_now or now
        self._down.set()

    async def _start_group(self, group: list[Instance]) -> None:
        for inst in group:
            inst.task = asyncio.create_task(self._life(inst), name=f"life-{inst.spec.name}")
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
        tail = self.log_tail(inst.spec.name)
        raise StartupFailed(
            f"{inst.spec.name} ({inst.spec.component} on {inst.spec.host}) failed to start: "
            f"{inst.message or 'exited'}\n--- last lines of {self.run_dir.log_of(inst.spec.name)}"
            f" ---\n{tail}"
        )

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.run_dir.log_of(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def _teardown(self, now: bool) -> None:
        """Stop everything, the reverse of the start order, each group in parallel."""
        for component in reversed(START_ORDER):
            group = [i for i in self.instances.values() if i.spec.component == component]
            await asyncio.gather(*(self._stop_instance(i, now) for i in group))
        for inst in self.instances.values():
            if inst.task is not None:
                inst.task.cancel()
                await asyncio.gather(inst.task, return_exceptions=True)

    async def _stop_instance(self, inst: Instance, now: bool) -> None:
        inst.wanted = False
        proc = inst.proc
        if proc is None or proc.returncode is not None:
            if inst.state not in (State.FAILED,):
                inst.state = State.STOPPED
            self._release(inst)
            return
        inst.state = State.DRAINING
        self.changed()
        grace = NOW_TIMEOUT if now else self.settings.drain_timeout
        await stop(proc, grace)
        if inst.task is not None and not inst.task.done():
            await inst.ended.wait()
        inst.state = State.STOPPED
        self._release(inst)
        self.changed()

    def _release(self, inst: Instance) -> None:
        """Give a stopped instance's GPUs back for ``scale`` (once: the map may have handed
        them to another instance since)."""
        if inst.spec.gpus and not inst.released:
            self.gpu_map.release(inst.spec.host, inst.spec.gpus)
            inst.released = True

    # -- one instance ---------------------------------------------------------------------

    async def _life(self, inst: Instance) -> None:
        backoff = Backoff(self.settings.backoff_base, self.settings.backoff_cap)
        try:
            while inst.wanted:
                inst.ready.clear()
                inst.ended.clear()
                inst.state, inst.started_at, inst.sample = State.STARTING, time.monotonic(), None
                self.changed()
                reason, hung = await self._run_once(inst)
                inst.ended.set()
                if not inst.wanted:
                    inst.state = State.STOPPED
                    self.changed()
                    return
                inst.state, inst.reason = State.FAILED, reason
                now = time.monotonic()
                inst.failures.append(now)
                while inst.failures and inst.failures[0] < now - self.settings.budget_window:
                    inst.failures.popleft()
                if hung:
                    inst.message = hung
                elif inst.proc is not None:
                    inst.message = f"exited with status {inst.last_exit}"
                log.warning("%s failed: %s", inst.spec.name, inst.message)
                self.changed()
                if self._starting:
                    return  # up rolls back instead of crash-looping on a bad configuration
                if len(inst.failures) > self.settings.restart_budget:
                    inst.message += (
                        f"; restart budget spent ({self.settings.restart_budget} restarts in "
                        f"{self.settings.budget_window:.0f} s): not restarting"
                    )
                    self.changed()
                    return
                inst.state = State.BACKOFF
                self.changed()
                await asyncio.sleep(backoff.next())
                inst.restarts += 1
                spec = inst.spec
                self.restart_counts[(spec.name, spec.component, spec.pool, inst.reason)] += 1
        finally:
            inst.ended.set()

    async def _run_once(self, inst: Instance) -> tuple[RestartReason, str]:
        """Run one process of ``inst`` to its end: why it ended, and, when it was killed
        as hung, a message that says why (empty for an exit of its own)."""
        try:
            proc = await self.launcher.start(inst.spec, self.run_dir.log_of(inst.spec.name))
        except LaunchError as exc:
            inst.proc, inst.message = None, str(exc)
            return "launch", ""
        inst.proc = proc
        self.save()
        hung = ""
        reason: RestartReason = "exit"
        unhealthy_since: float | None = None
        last_tokens = -1.0
        while proc.returncode is None and not hung:
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), self.settings.probe_interval)
                break
            except asyncio.TimeoutError:
                pass
            if not inst.wanted:
                continue  # being stopped: only wait for the exit
            now = time.monotonic()
            if inst.state == State.STARTING:
                if await self._is_ready(inst):
                    inst.state = State.READY  # message keeps the last failure
                    inst.ready.set()
                    self.changed()
                elif now - (inst.started_at or now) > self.settings.start_timeout:
                    reason, hung = (
                        "start_timeout",
                        f"not ready after {self.settings.start_timeout:.0f} s",
                    )
                continue
            healthy, tokens = await self._is_healthy(inst)
            progressing = tokens is None or tokens != last_tokens
            last_tokens = tokens if tokens is not None else last_tokens
            if healthy and progressing:
                unhealthy_since = None
            elif unhealthy_since is None:
                unhealthy_since = now
            elif now - unhealthy_since > self.settings.hang_timeout:
                what = "no token generated" if healthy else "not answering probes"
                reason = "hang" if healthy else "probe"
                hung = f"hung: {what} for {self.settings.hang_timeout:.0f} s"
        if hung:
            log.warning("%s %s: killing it", inst.spec.name, hung)
            await stop(proc, 5.0)
        inst.last_exit = await proc.wait()
        return reason, hung

    def probes(self) -> Probes:
        if self._probes is None:
            store = store_from_url(self.plan.discovery_url)
            self._probes = Probes(store, self.plan.namespace, self.settings.probe_interval / 2)
        return self._probes

    async def _is_ready(self, inst: Instance) -> bool:
        probes = self.probes()
        component = inst.spec.component
        if component == "etcd":
            return await probes.ok(f"{_base_url(inst.spec, 'client')}/health")
        if component == "frontend":
            return await probes.frontend_ready(
                _base_url(inst.spec, "http") + "/v1", self.plan.model
            )
        await probes.refresh_records()
        return inst.spec.name in probes.records

    async def _is_healthy(self, inst: Instance) -> tuple[bool, float | None]:
        """Answering probes; and for workers with requests in flight, the token counter
        (None when progress is not in question)."""
        probes = self.probes()
        component = inst.spec.component
        if component == "etcd":
            return await self._is_ready(inst), None
        if component == "frontend":
            return await probes.ok(f"{_base_url(inst.spec, 'http')}/health"), None
        await probes.refresh_records()
        record = probes.records.get(inst.spec.name)
        if record is None or record.metrics_url is None:
            return False, None
        if component == "router":  # registered, and its /health answers
            return await probes.ok(record.metrics_url.removesuffix("/metrics") + "/health"), None
        inst.sample = await probes.scrape_worker(record.metrics_url)
        if inst.sample is None:
            return False, None
        return True, inst.sample.output_tokens if inst.sample.inflight > 0 else None

    # -- commands -----------------------------------------------------------------------

    def select(self, target: str) -> list[Instance]:
        """Instances named ``target``, or every instance of pool ``target``."""
        if target in self.instances:
            return [self.instances[target]]
        return [i for i in self.instances.values() if i.spec.pool == target]

    async def drain(self, target: str) -> list[str]:
        chosen = [i for i in self.select(target) if i.wanted]
        if not chosen:
            raise KeyError(f"no running instance or pool named {target!r}")
        for inst in chosen:
            task = asyncio.create_task(self._stop_instance(inst, now=False))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        await asyncio.sleep(0)
        return [i.spec.name for i in chosen]

    async def scale(self, pool: str, replicas: int) -> ScaleReply:
        pools = self.recipe.workers.pools()
        if pool not in pools:
            raise KeyError(f"no worker pool {pool!r} (pools: {', '.join(pools)})")
        role: Role = pool
        active = [i for i in self.instances.values() if i.spec.pool == pool and i.wanted]
        touched: list[str] = []
        if replicas < len(active):
            for inst in sorted(active, key=lambda i: int(i.spec.name.rsplit("-", 1)[1]))[replicas:]:
                touched += await self.drain(inst.spec.name)
            return ScaleReply(drained=touched)
        taken = {
            int(i.spec.name.rsplit("-", 1)[1])
            for i in self.instances.values()
            if i.spec.pool == pool and i.wanted
        }
        index = 0
        for _ in range(replicas - len(active)):
            while index in taken:
                index += 1
            taken.add(index)
            placed = self.gpu_map.take(pools[role].gpus_per_replica)
            if placed is None:
                raise PlanError(f"no free GPUs left for another {pool} replica")
            spec = worker_spec(
                self.recipe, role, index, placed[0], placed[1], self.plan.discovery_url
            )
            old = self.instances.get(spec.name)
            if old is not None and old.task is not None and not old.task.done():
                raise PlanError(f"{spec.name} is still stopping; try again when it is STOPPED")
            inst = self.instances[spec.name] = Instance(spec)
            inst.task = asyncio.create_task(self._life(inst), name=f"life-{spec.name}")
            touched.append(spec.name)
        self.save()
        return ScaleReply(started=touched)

    # -- reporting ------------------------------------------------------------------------

    def status(self) -> StatusReport:
        now = time.monotonic()
        rows = []
        for inst in self.instances.values():
            running = inst.proc is not None and inst.proc.returncode is None
            rows.append(
                InstanceStatus(
                    name=inst.spec.name,
                    pool=inst.spec.pool,
                    component=inst.spec.component,
                    host=inst.spec.host,
                    pid=inst.proc.record.pid if inst.proc is not None and running else None,
                    state=inst.state.value,
                    restarts=inst.restarts,
                    uptime_s=now - inst.started_at if running and inst.started_at else None,
                    inflight=inst.sample.inflight if running and inst.sample else None,
                    kv_usage=inst.sample.kv_usage if running and inst.sample else None,
                    last_exit=inst.last_exit,
                    message=inst.message,
                )
            )
        return StatusReport(
            name=self.plan.name,
            phase=self.phase,
            endpoint=self.plan.endpoint,
            model=self.plan.model,
            target=self.plan.target,
            instances=rows,
        )

    def changed(self) -> None:
        self.on_change()

    def save(self) -> None:
        records = {
            name: inst.proc.record
            for name, inst in self.instances.items()
            if inst.proc is not None and inst.proc.returncode is None
        }
        self.run_dir.write_state(
            RunState(
                name=self.plan.name,
                recipe=self.recipe_path,
                supervisor_pid=os.getpid(),
                phase=self.phase,
                control=self.control_url,
                token=self.token,
                slurm_job=self.slurm_job,
                error=self.error,
                plan=msgspec.structs.replace(
                    self.plan, instances=[inst.spec for inst in self.instances.values()]
                ),
                records=records,
            )
        )
        self.changed()


def _base_url(spec: InstanceSpec, port: str) -> str:
    """Where the supervisor reaches an instance's declared port (its address, not the
    name people use: a head node may resolve its own name to loopback)."""
    return f"http://{spec.address}:{spec.ports[port]}"
