"""The GPU budget: the pools' replicas together never hold more than it. A replica without
GPUs (the mocker, a CPU engine) counts as one, so a simulated deployment is bounded the way
a real one would be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dynamoctl.planner.records import PoolSpec
from dynamoctl.settings.component import Role


class BudgetError(ValueError):
    """The pools' minimums alone exceed the budget: a configuration no decision can honour."""


def units(specs: Sequence[PoolSpec], replicas: Mapping[Role, int]) -> int:
    """Budget units ``replicas`` hold (pools not in ``specs`` hold none)."""
    return sum(spec.budget_units * replicas.get(spec.role, 0) for spec in specs)


def check_budget(specs: Sequence[PoolSpec], budget: int) -> None:
    """Refuse pools whose ``min_replicas`` do not fit in ``budget``, naming the knobs."""
    needed = units(specs, {spec.role: spec.min_replicas for spec in specs})
    if needed > budget:
        terms = " + ".join(
            f"{spec.role}_min_replicas {spec.min_replicas} x {spec.budget_units}" for spec in specs
        )
        raise BudgetError(f"{terms} = {needed} GPUs, over gpu_budget {budget}")


def fit_to_budget(
    specs: Sequence[PoolSpec],
    wanted: Mapping[Role, int],
    least: Mapping[Role, int],
    budget: int,
) -> tuple[dict[Role, int], set[Role]]:
    """``wanted`` replicas per pool when they fit in ``budget``; otherwise each pool starts
    from its ``least`` (which must fit) and the rest of the budget goes one replica at a
    time to the pool furthest (as a fraction) from what it wants, ties to the earlier pool
    in ``specs``. Returns the counts and the pools that got less than they wanted."""
    if units(specs, wanted) <= budget:
        return dict(wanted), set()
    given = {spec.role: min(least[spec.role], wanted[spec.role]) for spec in specs}
    left = budget - units(specs, given)
    while True:
        growable = [
            spec
            for spec in specs
            if given[spec.role] < wanted[spec.role] and spec.budget_units <= left
        ]
        if not growable:
            break
        spec = min(growable, key=lambda s: given[s.role] / wanted[s.role])
        given[spec.role] += 1
        left -= spec.budget_units
    return given, {spec.role for spec in specs if given[spec.role] < wanted[spec.role]}
