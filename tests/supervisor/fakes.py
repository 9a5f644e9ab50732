"""A launcher and a prober that start nothing: the supervision policy, tested alone.

:class:`FakeLauncher` implements ``dynamoctl/launch/api.py``'s protocols with processes
that are futures: the test ends them (``exit``), or a signal does (SIGTERM ends them unless
``deaf``, SIGKILL always). :class:`FakeProber` answers readiness and health from dicts the
test sets. A :class:`Harness` runs a real :class:`Supervisor` over them, strict about
transitions, with probe and backoff intervals of milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from dynamoctl.launch.api import InstanceSpec, LaunchError, ProcessRecord
from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.supervisor.probes import Health
from dynamoctl.supervisor.rundir import RunDir
from dynamoctl.supervisor.supervisor import Supervisor
from dynamoctl.wire.control import DiscoveryStatus
from dynamoctl.wire.states import Phase, State

FAST = {
    "probe_interval": 0.01,
    "hang_timeout": 0.1,
    "start_timeout": 2,
    "backoff_base": 0.01,
    "backoff_cap": 0.08,
    "restart_budget": 5,
    "budget_window": 30,
    "drain_timeout": 1,
}
"""Supervision in milliseconds: every test here runs in well under a second or two."""


def recipe_text(replicas: int = 2, gpus: int = 0, **supervision: float) -> str:
    settings = ", ".join(f"{k}: {v}" for k, v in {**FAST, **supervision}.items())
    return f"""\
schema: 1
name: unit
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
target: {{kind: local, gpus: {gpus}}}
workers:
  agg: {{engine: mocker, replicas: {replicas}, gpus_per_replica: {1 if gpus else 0}}}
supervision: {{{settings}}}
"""


class FakeProcess:
    """A started instance whose end the test (or a signal) decides."""

    def __init__(self, spec: InstanceSpec, pid: int, deaf: bool = False) -> None:
        self.spec = spec
        self.record = ProcessRecord(launcher="fake", host=spec.host, pid=pid, pgid=pid)
        self.deaf = deaf
        """Ignores SIGTERM: only SIGKILL ends it."""
        self.signals: list[int] = []
        self.unseen = False
        """Its end is never reported, SIGKILL's included (an exit the event loop missed)."""
        self._end: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def returncode(self) -> int | None:
        return self._end.result() if self._end.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._end)

    async def signal(self, sig: int) -> None:
        if self._end.done():
            return
        self.signals.append(sig)
        if self.unseen:
            return
        if sig == signal.SIGKILL:
            self.exit(-signal.SIGKILL)
        elif not self.deaf:
            self.exit(128 + sig)

    def exit(self, code: int) -> None:
        if not self._end.done():
            self._end.set_result(code)


class FakeLauncher:
    kind = "fake"

    def __init__(self) -> None:
        self.started: dict[str, list[FakeProcess]] = defaultdict(list)
        self.on_start: Callable[[FakeProcess], None] = lambda proc: None
        """Called with each new process: a test makes it crash at once, say."""
        self.refuse: set[str] = set()
        """Instances whose start raises LaunchError."""
        self.gate: asyncio.Event | None = None
        """When set to an event, ``start`` waits for it (a slow launch)."""
        self._pids = itertools.count(1000)

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        pass

    def describe(self, spec: InstanceSpec) -> list[str]:
        return spec.argv

    async def start(self, spec: InstanceSpec, log: Path) -> FakeProcess:
        if self.gate is not None:
            await self.gate.wait()
        if spec.name in self.refuse:
            raise LaunchError(f"{spec.name}: refused by the test")
        proc = FakeProcess(spec, next(self._pids))
        self.started[spec.name].append(proc)
        self.on_start(proc)
        return proc

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        return False

    async def close(self) -> None:
        pass

    def current(self, name: str) -> FakeProcess:
        return self.started[name][-1]


class FakeProber:
    def __init__(self) -> None:
        self.ready_now: dict[str, bool] = {}
        """Readiness by instance name (default: ready)."""
        self.healths: dict[str, Callable[[], Health]] = {}
        """Health by instance name (default: answering, nothing in flight)."""
        self.hung: set[str] = set()
        """Instances whose probes never return (nor end when cancelled, for a while)."""

    async def _hang(self, spec: InstanceSpec) -> None:
        while spec.name in self.hung:
            with contextlib.suppress(asyncio.CancelledError):  # a probe deaf to cancels
                await asyncio.sleep(0.05)

    async def ready(self, spec: InstanceSpec) -> bool:
        await self._hang(spec)
        return self.ready_now.get(spec.name, True)

    async def health(self, spec: InstanceSpec) -> Health:
        await self._hang(spec)
        probe = self.healths.get(spec.name)
        return probe() if probe is not None else Health(True)

    async def reset(self) -> None:
        pass

    def discovery(self) -> DiscoveryStatus:
        return DiscoveryStatus(reachable=True)

    async def close(self) -> None:
        pass


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.005)


class Harness:
    def __init__(self, sup: Supervisor, launcher: FakeLauncher, prober: FakeProber) -> None:
        self.sup = sup
        self.launcher = launcher
        self.prober = prober

    def state(self, name: str) -> State:
        return self.sup.instances[name].state

    async def until_state(self, name: str, state: State, timeout: float = 5.0) -> None:
        await until(lambda: self.state(name) is state, f"{name} {state}", timeout)


def make_supervisor(
    tmp_path: Path, text: str, launcher: FakeLauncher, prober: FakeProber
) -> Supervisor:
    recipe = load_recipe_text(text, "unit.yaml")
    run_dir = RunDir(recipe.name, tmp_path / "home")
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    plan, gpu_map = build_plan(recipe, run_dir.path)
    sup = Supervisor(recipe, "unit.yaml", plan, gpu_map, launcher, run_dir, prober)
    sup.strict = True  # an illegal transition raises, and the test fails
    return sup


@asynccontextmanager
async def serving(tmp_path: Path, text: str | None = None) -> AsyncIterator[Harness]:
    """A supervisor over fakes, serving; at the end ``down`` and checks that it stopped
    cleanly and that no life task died of an exception (an illegal transition)."""
    launcher, prober = FakeLauncher(), FakeProber()
    sup = make_supervisor(tmp_path, text or recipe_text(), launcher, prober)
    run = asyncio.create_task(sup.run())
    harness = Harness(sup, launcher, prober)
    try:
        await until(lambda: sup.phase is Phase.SERVING or run.done(), "serving")
        if run.done():
            run.result()  # raises what stopped it
        yield harness
    finally:
        sup.request_down()
        await asyncio.wait_for(run, 10)
    assert sup.phase is Phase.STOPPED
    for inst in sup.instances.values():
        assert inst.state in (State.STOPPED, State.FAILED), (inst.spec.name, inst.state)
        task = inst.task
        if task is not None and not task.cancelled():
            assert task.exception() is None, (inst.spec.name, task.exception())
