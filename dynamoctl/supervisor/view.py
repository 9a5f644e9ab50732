"""What the supervisor's helpers may see of it and do to it: one narrow port each.

Gangs (``gang.py``), scaling (``scaling.py``), spares (``spares.py``), the metrics
collector (``metrics.py``), a process's watch (``watch.py``), the restart policy
(``restarts.py``) and stopping (``stopping.py``) are handed the
:class:`~dynamoctl.supervisor.supervisor.Supervisor` as one of these protocols, never as
itself: they read what the protocol names (mutable things only through
the methods it names) and change an instance's state only through
:meth:`GangView.transition`, the public door to the supervisor's state table. So they do
not import the supervisor, and the supervisor's members are its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from dynamoctl.launch.api import InstanceSpec, Launched
from dynamoctl.launch.capacity import ExtraCapacity
from dynamoctl.supervisor.instance import Instance
from dynamoctl.supervisor.wedge import SilenceKey
from dynamoctl.wire.states import Phase, RestartReason, State

if TYPE_CHECKING:
    from dynamoctl.plan.gpu_map import GpuMap
    from dynamoctl.plan.placed import Plan
    from dynamoctl.recipe.models import Recipe, Supervision
    from dynamoctl.supervisor.probes import Prober
    from dynamoctl.supervisor.rundir import RunDir
    from dynamoctl.supervisor.startups import Starts

RestartKey = tuple[str, str, str, RestartReason]
"""(instance, component, role, reason) of :attr:`MetricsView.restart_counts`."""
TransitionKey = tuple[str, str, str, State, State]
"""(instance, component, role, from, to) of :attr:`MetricsView.transition_counts`."""


class SpareKeeper(Protocol):
    """A deployment's warm spares (``spares.py``), as ``scale`` and ``/metrics`` use them."""

    @property
    def promotions(self) -> Counter[str]:
        """Spares promoted, by why (``scale``, ``replace``)."""
        ...

    def kept(self, pool: str) -> list[Instance]:
        """The pool's spares that are wanted, starting or on standby."""
        ...

    async def promote_for(self, pool: str, count: int) -> list[str]:
        """Promote up to ``count`` of the pool's spares; the names promoted."""
        ...

    def fill(self) -> list[str]:
        """Start the spares each pool is short of; their names."""
        ...


class GangView(Protocol):
    """What gangs need: the instances, a follower's process started, its state moved."""

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    def transition(self, inst: Instance, new: State, why: str) -> None:
        """Move ``inst`` to ``new``: checked against the table, logged, counted, shown."""
        ...

    async def start_process(self, spec: InstanceSpec) -> Launched:
        """Launch one process of ``spec``, its output to the instance's log."""
        ...


class GangLeaders(Protocol):
    def leaders(self, chosen: Iterable[Instance]) -> list[Instance]:
        """``chosen`` with followers replaced by their leaders, each once, in order."""
        ...


class PlacementView(Protocol):
    """What places new replicas: the pools and their placement, the instances, and
    replicas begun (the part :class:`ScalingView` and :class:`SparesView` share)."""

    @property
    def recipe(self) -> Recipe: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def run_dir(self) -> RunDir: ...

    @property
    def gpu_map(self) -> GpuMap: ...

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    def begin(self, specs: Sequence[InstanceSpec]) -> str:
        """Supervise the instances of one new replica (a gang's members, leader first) and
        start its life; the leader's name."""
        ...

    def save(self) -> None: ...


class ScalingView(PlacementView, Protocol):
    """What ``scale`` and extra capacity need besides placing: gangs, extra capacity,
    spares, and replicas drained."""

    @property
    def gangs(self) -> GangLeaders: ...

    @property
    def capacity(self) -> ExtraCapacity: ...

    @property
    def spares(self) -> SpareKeeper: ...

    async def drain(self, target: str, why: str = "drain") -> list[str]: ...

    def changed(self) -> None: ...


class SparesView(PlacementView, Protocol):
    """What warm spares need besides placing: the phase, and a spare's state moved to
    READY when promoted."""

    @property
    def phase(self) -> Phase: ...

    def transition(self, inst: Instance, new: State, why: str) -> None: ...


class MetricsView(Protocol):
    """What ``/metrics`` reads at scrape time."""

    @property
    def plan(self) -> Plan: ...

    @property
    def settings(self) -> Supervision: ...

    @property
    def phase(self) -> Phase: ...

    @property
    def instances(self) -> Mapping[str, Instance]: ...

    @property
    def capacity(self) -> ExtraCapacity: ...

    @property
    def restart_counts(self) -> Counter[RestartKey]: ...

    @property
    def transition_counts(self) -> Counter[TransitionKey]: ...

    @property
    def silence_counts(self) -> Counter[SilenceKey]: ...

    @property
    def spares(self) -> SpareKeeper: ...

    @property
    def starts(self) -> Starts: ...


class WatchView(Protocol):
    """What one process's watch (``watch.py``) reads: how to probe, how long a start may
    take, and the silences it counts; it changes an instance only through ``transition``."""

    @property
    def settings(self) -> Supervision: ...

    @property
    def prober(self) -> Prober: ...

    @property
    def starts(self) -> Starts: ...

    @property
    def silence_counts(self) -> Counter[SilenceKey]: ...

    def transition(self, inst: Instance, new: State, why: str) -> None: ...


class RestartView(Protocol):
    """What the restart policy (``restarts.py``) reads and counts."""

    @property
    def settings(self) -> Supervision: ...

    @property
    def starting(self) -> bool:
        """``up`` is still starting the deployment: a failure rolls back, not restarts."""

    @property
    def capacity(self) -> ExtraCapacity: ...

    @property
    def restart_counts(self) -> Counter[RestartKey]: ...

    def transition(self, inst: Instance, new: State, why: str) -> None: ...


class GangStops(Protocol):
    """What stopping an instance asks of its gang (``gang.py``'s :class:`Gangs`)."""

    def release(self, leader: Instance, give_back: Callable[[str], None]) -> None: ...

    async def stop(self, leader: Instance, grace: float) -> None: ...


class StopView(Protocol):
    """What stopping an instance on purpose (``stopping.py``) reads and gives back."""

    @property
    def settings(self) -> Supervision: ...

    @property
    def gangs(self) -> GangStops: ...

    @property
    def gpu_map(self) -> GpuMap: ...

    @property
    def capacity(self) -> ExtraCapacity: ...

    def transition(self, inst: Instance, new: State, why: str) -> None: ...
