"""Mutated recipes (tests/recipe/mutation.py, seeded): each one loads, or is refused with a
RecipeError whose every issue has a line; each one that loads plans and renders as
``up --dry-run`` does, or is refused with a PlanError; each one in well under a second.
Any other exception, or a stall, is a failure.

The shipped recipes mutated at random, 1,200 of them with another seed, gave 66 tracebacks
(RecursionError, AttributeError from ruamel, TypeError rendering a tag or a date as JSON),
29 stalls over 5 s (alias bombs, replicas: 1000000000) and 93 errors without a line
before the loader's hardening."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from dynamoctl.launch.registry import launcher_for
from dynamoctl.plan.build import PlanError, build_plan, render
from dynamoctl.plan.hosts import HostError
from dynamoctl.recipe import Recipe, RecipeError, load_recipe
from dynamoctl.recipe.targets import SlurmTarget, SshTarget
from tests.recipe.mutation import corpus

COUNT = 600
SEED = 20250611
CASE_LIMIT_S = 2.0  # a case takes milliseconds; a stall used to take minutes
TOTAL_LIMIT_S = 60.0


def declared(recipe: Recipe) -> tuple[list[str] | None, Mapping[str, str]]:
    """What a dry run is told (``--nodes``, ``--resolve``), so that no name is looked up."""
    target = recipe.target
    if isinstance(target, SshTarget):
        return None, {host: f"192.0.2.{i % 250 + 1}" for i, host in enumerate(target.hosts)}
    if isinstance(target, SlurmTarget):
        nodes = [f"node{i:02d}" for i in range(target.nodes)]
        return nodes, {node: f"192.0.2.{i % 250 + 1}" for i, node in enumerate(nodes)}
    return None, {}


def dry_run(path: Path) -> str:
    """What happened to one mutated recipe: ok, refused by the loader, or by the plan."""
    try:
        recipe = load_recipe(path)
    except RecipeError as exc:
        assert exc.issues and all(issue.line is not None for issue in exc.issues), str(exc)
        assert all(issue.file == str(path) for issue in exc.issues)
        return "refused"
    allocation, resolve = declared(recipe)
    try:
        plan, _ = build_plan(recipe, Path("/run"), allocation, resolve)
    except (PlanError, HostError):  # the dry run prints these as one line, exit 1
        return "not placed"
    render(plan, launcher_for(recipe).describe)
    return "ok"


@pytest.mark.timeout(2 * TOTAL_LIMIT_S)
def test_mutated_recipes_load_and_plan_or_are_refused(tmp_path: Path) -> None:
    outcomes: dict[str, int] = {}
    crashed: list[tuple[str, str]] = []
    slow: list[tuple[str, float]] = []
    started = time.perf_counter()
    for name, data in corpus(COUNT, SEED):
        path = tmp_path / name
        path.write_bytes(data)
        case_started = time.perf_counter()
        try:
            outcome = dry_run(path)
        except Exception as exc:  # a traceback for the user: name every such case
            crashed.append((name, repr(exc)[:200]))
            continue
        took = time.perf_counter() - case_started
        if took > CASE_LIMIT_S:
            slow.append((name, round(took, 2)))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert crashed == []
    assert slow == []
    assert time.perf_counter() - started < TOTAL_LIMIT_S
    # The corpus exercises both sides: recipes that survive mutation and plan, and refusals.
    assert outcomes.get("ok", 0) > 10 and outcomes.get("refused", 0) > COUNT // 2, outcomes
