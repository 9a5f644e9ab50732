"""One supervised instance: its name (pool + index) and what the supervisor knows of it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from dynamoctl.launch.api import InstanceSpec, Launched
from dynamoctl.supervisor.startups import StartClock
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.planner import PlannerStatus
from dynamoctl.wire.states import RestartReason, State


@dataclass(frozen=True, order=True)
class InstanceName:
    """An instance's name: its pool and its index there (``agg-1``, ``frontend-0``), what
    ``drain`` and ``scale`` address; a gang's follower adds its node rank (``agg-1.2``,
    the leader keeps ``agg-1``). Orders by pool, index, rank (``agg-2`` < ``agg-10``)."""

    pool: str
    index: int
    rank: int = 0

    @classmethod
    def of(cls, spec: InstanceSpec) -> InstanceName:
        """The name the plan gave ``spec``: ``{spec.pool}-{index}[.{rank}]``."""
        tail = spec.name.removeprefix(f"{spec.pool}-")
        index, _, rank = tail.partition(".")
        if tail == spec.name or not index.isdigit() or not (rank.isdigit() or rank == ""):
            raise ValueError(f"instance {spec.name!r} is not named {spec.pool}-INDEX[.RANK]")
        return cls(spec.pool, int(index), int(rank or 0))

    @property
    def leader(self) -> InstanceName:
        """The gang's leader (itself for a leader or a one-node instance)."""
        return InstanceName(self.pool, self.index)

    def __str__(self) -> str:
        return f"{self.pool}-{self.index}" + (f".{self.rank}" if self.rank else "")


STANDBY_FLAG = "--standby"
"""The worker flag that makes a process a warm spare (``dynamoctl worker --standby``)."""


def as_spare(spec: InstanceSpec, spare: bool) -> InstanceSpec:
    """``spec`` with its worker started as a warm spare, or not: the flag follows
    ``worker`` in its command line, before the engine's arguments."""
    argv = [arg for arg in spec.argv if arg != STANDBY_FLAG]
    if spare:
        at = argv.index("worker") + 1 if "worker" in argv else len(argv)
        argv.insert(at, STANDBY_FLAG)
    return msgspec.structs.replace(spec, argv=argv)


Failure = tuple[RestartReason, str]
"""Why a process ended while it was wanted, and that in words."""


def free_indices(taken: Iterable[int], count: int) -> list[int]:
    """The ``count`` lowest indices not in ``taken`` (a scale-up fills gaps first)."""
    used, found, index = set(taken), list[int](), 0
    while len(found) < count:
        if index not in used:
            found.append(index)
        index += 1
    return found


@dataclass
class Instance:
    """A planned instance and its current process, as the supervision loop sees it."""

    spec: InstanceSpec
    backoff: Backoff
    """Restart delays; reset after ``budget_window`` READY (see ``Restarts.after_failure``)."""
    state: State = State.PENDING
    proc: Launched | None = None
    adopted: Launched | None = None
    """A process a dead supervisor left running, taken back: watched instead of launched
    the first time its life runs (docs/operations.md, "Restarting the supervisor")."""
    restarts: int = 0
    failures: deque[float] = field(default_factory=deque)
    """Monotonic times of its failures within ``budget_window``."""
    reason: RestartReason = RestartReason.EXIT
    """Why the last process ended unexpectedly (the restart counter's label)."""
    started_at: float | None = None
    ready_since: float | None = None
    """When the current process became READY; None while it is not."""
    last_exit: int | None = None
    message: str = ""
    """The last failure, in words (kept after a successful restart)."""
    sample: WorkerHealth | PlannerStatus | None = None
    released: bool = False
    """Its GPUs went back to the map (it was stopped on purpose)."""
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when its current process has ended."""
    stop_asked: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by drain, scale-down or ``down``: never restarted again."""
    stop_why: str = ""
    """Who asked it to stop (``drain``, ``scale-down``, ``down``), for the log."""
    clock: StartClock = field(default_factory=StartClock)
    """Its current start's stamps and the phases of its last timed start."""

    @property
    def name(self) -> InstanceName:
        return InstanceName.of(self.spec)

    @property
    def standby(self) -> bool:
        """A warm spare: started with ``--standby``, out of routing until promoted."""
        return STANDBY_FLAG in self.spec.argv

    @property
    def wanted(self) -> bool:
        return not self.stop_asked.is_set()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None
