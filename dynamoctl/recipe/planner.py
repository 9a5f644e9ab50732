"""The recipe's ``planner:`` section: :class:`~dynamoctl.planner.settings.PlannerSettings`
itself (one declaration for the section, ``dynamoctl planner``'s flags and the command
line the plan renders), and the rules that tie it to the workers: the pools' minimums and
starting replicas within the GPU budget, knobs only for pools the deployment has, a
profile measured on these pools (docs/planner.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from dynamoctl.planner.budget import BudgetError, check_budget, units
from dynamoctl.planner.records import PoolSpec
from dynamoctl.planner.settings import POOL_ROLES, PlannerSettings
from dynamoctl.recipe.fields import RecipeModel, rule_error
from dynamoctl.settings.component import Role


class PlannedPool(Protocol):
    """What the rules read of a worker pool (:class:`~dynamoctl.recipe.workers.WorkerPool`,
    whose recipe calls them: named by its fields, not imported back)."""

    @property
    def engine(self) -> str: ...
    @property
    def replicas(self) -> int: ...
    @property
    def gpus_per_replica(self) -> int: ...


class Planner(RecipeModel, PlannerSettings):
    """The SLA planner: ``dynamoctl up`` runs it (and restarts it) when this section is
    present. It scales the worker pools to the TTFT and ITL targets within ``gpu_budget``,
    through the supervisor, so that every scale-down drains. Its knobs are ``dynamoctl
    planner``'s options (docs/planner.md)."""


def planner_specs(planner: PlannerSettings, pools: Mapping[Role, PlannedPool]) -> list[PoolSpec]:
    """The pools the planner scales: every declared pool, with the planner's bounds."""
    return [
        PoolSpec(
            role=role,
            gpus_per_replica=pool.gpus_per_replica,
            min_replicas=planner.bounds(role)[0],
            max_replicas=planner.bounds(role)[1],
        )
        for role, pool in pools.items()
    ]


def check_planner(planner: Planner, declared: Mapping[Role, PlannedPool], model: str) -> None:
    """Refuse a planner section the deployment with pools ``declared`` serving ``model``
    cannot honour; errors name the field (relative to the recipe)."""
    for role in POOL_ROLES:
        if role in declared:
            continue
        for bound in (f"{role}_min_replicas", f"{role}_max_replicas"):
            # Not "given": `recipe show` writes every default, and must read back.
            if getattr(planner, bound) != PlannerSettings.model_fields[bound].default:
                raise rule_error(f"planner.{bound}", f"the deployment has no {role} pool")
    specs = planner_specs(planner, declared)
    try:
        check_budget(specs, planner.gpu_budget)
    except BudgetError as exc:
        raise rule_error("planner.gpu_budget", str(exc)) from None
    start = units(specs, {role: pool.replicas for role, pool in declared.items()})
    if start > planner.gpu_budget:
        raise rule_error(
            "planner.gpu_budget",
            f"the workers' replicas hold {start} GPUs at start (a replica without GPUs counts "
            f"as one), over gpu_budget {planner.gpu_budget}",
        )
    if planner.profile is None:
        if planner.mode == "throughput":
            raise rule_error(
                "planner.mode", "throughput needs a profile (planner.profile); or use load"
            )
        return
    from dynamoctl.planner.perf import ProfileError, check_profile, load_profile  # numpy: lazily

    try:
        profile = load_profile(Path(planner.profile).expanduser())
        for pool in declared.values():
            check_profile(
                profile,
                model=model,
                engine=pool.engine,
                gpus_per_replica=pool.gpus_per_replica,
            )
    except (OSError, ProfileError) as exc:
        raise rule_error("planner.profile", f"{planner.profile}: {exc}") from None
