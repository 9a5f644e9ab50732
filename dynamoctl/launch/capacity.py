"""Room beyond what a deployment was given, asked of its launcher through a small protocol.

When ``scale`` asks for a replica the GPU map has no room for, the supervisor asks its
:class:`ExtraCapacity` to make room (:meth:`ExtraCapacity.defer`). A launcher that can
grow a deployment provides one (:class:`GrowsCapacity`; the Slurm launcher's extra jobs,
``launch/slurm/growth.py``); any other gets :class:`NoExtraCapacity`, which says there is
none. The provider changes the deployment only through the :class:`CapacityUser` port the
supervisor hands it: nodes joining and leaving, replicas placed and stopped. So the
supervisor knows no Slurm, and the provider no supervisor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dynamoctl.settings import Role
from dynamoctl.wire.control import GrowthJob

if TYPE_CHECKING:
    from dynamoctl.recipe.models import Recipe


class CapacityError(Exception):
    """No room could be had, or a node or replica could not join; the words say why (and
    name the recipe field to change)."""


class CapacityUser(Protocol):
    """The deployment as a capacity provider may change it (the supervisor's side)."""

    def place(self, role: Role, index: int) -> str:
        """Place replica ``index`` of ``role`` on the GPU map and start it; its name.
        :class:`CapacityError` when there is no room."""
        ...

    def add_nodes(self, nodes: Sequence[str], addresses: Mapping[str, str]) -> None:
        """``nodes`` join the GPU map (their addresses from ``addresses`` or resolved
        here); :class:`CapacityError` when one cannot be reached."""
        ...

    def remove_nodes(self, nodes: Sequence[str]) -> None:
        """``nodes`` leave the GPU map: nothing more is placed on them."""
        ...

    def occupied(self) -> set[str]:
        """Hosts on which an instance is wanted or still stopping."""
        ...

    async def stop_on(self, nodes: Collection[str], why: str) -> None:
        """Drain every wanted replica (a gang as one) that runs on one of ``nodes``."""
        ...

    def changed(self) -> None:
        """Something ``status`` shows changed."""
        ...

    def save(self) -> None:
        """Write the deployment's state (after replicas were placed)."""
        ...


class ExtraCapacity(Protocol):
    """Room beyond the deployment's own hosts, as the supervisor asks for it."""

    def waiting(self, role: Role) -> list[int]:
        """Indices of ``role`` replicas waiting for room that is on its way."""
        ...

    async def defer(self, role: Role, index: int, why: str) -> str | None:
        """Make room for replica ``index`` of ``role``, which the GPU map has none for
        (``why``, in words): it is placed once the room comes. The id of what was asked
        for, or None when it waits for room already asked for; :class:`CapacityError`
        when no room can be had."""
        ...

    def withdraw(self, role: Role, count: int) -> list[int]:
        """Give up the ``count`` highest waiting ``role`` replicas (a scale-down); their
        indices."""
        ...

    def check_release(self) -> None:
        """Give back the room none of the deployment's instances uses any more."""
        ...

    async def check_host(self, host: str) -> None:
        """An instance on ``host`` failed: if ``host``'s room is gone, stop its replicas
        now instead of restarting them there."""
        ...

    async def close(self) -> None:
        """At the end of the deployment: give back everything still held."""
        ...

    def status(self) -> list[GrowthJob]:
        """What was asked for, and its state, for ``status`` and ``/metrics``."""
        ...


@runtime_checkable
class GrowsCapacity(Protocol):
    """A launcher that can give a deployment extra capacity."""

    def extra_capacity(self, recipe: Recipe, user: CapacityUser, logs: Path) -> ExtraCapacity:
        """The provider for one deployment (``logs``: its run directory's log folder)."""
        ...


class NoExtraCapacity:
    """A launcher's deployment that cannot grow: there is never more room."""

    def waiting(self, role: Role) -> list[int]:
        return []

    async def defer(self, role: Role, index: int, why: str) -> str | None:
        raise CapacityError(f"no free GPUs left for another {role} replica: {why}")

    def withdraw(self, role: Role, count: int) -> list[int]:
        return []

    def check_release(self) -> None:
        pass

    async def check_host(self, host: str) -> None:
        pass

    async def close(self) -> None:
        pass

    def status(self) -> list[GrowthJob]:
        return []


def extra_capacity(
    launcher: object, recipe: Recipe, user: CapacityUser, logs: Path
) -> ExtraCapacity:
    """What ``launcher`` can give the deployment of ``recipe`` beyond its hosts."""
    if isinstance(launcher, GrowsCapacity):
        return launcher.extra_capacity(recipe, user, logs)
    return NoExtraCapacity()
