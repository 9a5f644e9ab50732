"""Where ``scale`` puts replicas: across an SSH target's hosts (what the planner relies on
to scale on SSH machines), and on an extra Slurm job's nodes once they join the map
(docs/operations.md, "Growing beyond the allocation"). Pure placement: no process runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.plan.build import PlanError, build_plan, place_replica
from dynamoctl.plan.hosts import Host
from dynamoctl.recipe import RecipeError, load_recipe_text
from dynamoctl.wire.states import GROWTH_TRANSITIONS, GrowthState

HOSTS = {"h1": "10.9.0.1", "h2": "10.9.0.2", "h3": "10.9.0.3"}


def _recipe(target: str, gpus_per_replica: int, replicas: int = 1) -> str:
    return f"""\
schema: 1
name: spread
discovery: {{backend: etcd, managed: true}}
target: {target}
model: {{name: m, path: m}}
workers:
  agg: {{engine: mocker, replicas: {replicas}, gpus_per_replica: {gpus_per_replica}}}
"""


def _scale_up(
    text: str, tmp_path: Path, count: int, allocation: list[str] | None = None
) -> list[str]:
    """Hosts of replicas 1..count added after the plan's, as ``scale`` places them."""
    recipe = load_recipe_text(text, "spread.yaml")
    plan, gpu_map = build_plan(recipe, tmp_path, allocation, HOSTS)
    hosts = [spec.host for spec in plan.by_pool("agg")]
    for index in range(1, count + 1):
        (spec,) = place_replica(recipe, "agg", index, gpu_map, plan.discovery_url, tmp_path)
        hosts.append(spec.host)
    return hosts


def test_scale_on_ssh_spreads_gpu_replicas_over_the_hosts(tmp_path: Path) -> None:
    target = "{kind: ssh, hosts: [h1, h2, h3], gpus_per_host: 2}"
    assert _scale_up(_recipe(target, 2), tmp_path, 2) == ["h1", "h2", "h3"]
    with pytest.raises(PlanError, match="3 host\\(s\\) with 2 GPU\\(s\\) each"):
        _scale_up(_recipe(target, 2), tmp_path, 3)


def test_scale_on_ssh_round_robins_cpu_replicas(tmp_path: Path) -> None:
    target = "{kind: ssh, hosts: [h1, h2, h3]}"
    assert _scale_up(_recipe(target, 0, 2), tmp_path, 4) == ["h1", "h2", "h3", "h1", "h2", "h3"]


def test_an_extra_jobs_nodes_take_replicas_after_the_allocation_and_leave_whole(
    tmp_path: Path,
) -> None:
    recipe = load_recipe_text(
        _recipe("{kind: slurm, partition: p, nodes: 1, gpus_per_node: 2}", 2), "spread.yaml"
    )
    plan, gpu_map = build_plan(recipe, tmp_path, ["h1"], HOSTS)
    with pytest.raises(PlanError):  # the allocation is full
        place_replica(recipe, "agg", 1, gpu_map, plan.discovery_url, tmp_path)
    gpu_map.add_hosts([Host("h2", HOSTS["h2"])])
    (spec,) = place_replica(recipe, "agg", 1, gpu_map, plan.discovery_url, tmp_path)
    assert (spec.host, spec.gpus) == ("h2", [0, 1])
    assert [h.name for h in plan.hosts] == ["h1"]  # the plan's own hosts are untouched
    gpu_map.release("h2", spec.gpus)
    gpu_map.remove_hosts(["h2"])
    gpu_map.release("h2", spec.gpus)  # a late release of a released node is harmless
    with pytest.raises(PlanError):  # its node left with it
        place_replica(recipe, "agg", 1, gpu_map, plan.discovery_url, tmp_path)


def test_growth_states_end_released_or_failed() -> None:
    final = {s for s, after in GROWTH_TRANSITIONS.items() if not after}
    assert final == {GrowthState.RELEASED, GrowthState.FAILED}
    assert GrowthState.RUNNING not in GROWTH_TRANSITIONS[GrowthState.RELEASING]
    assert set(GROWTH_TRANSITIONS) == set(GrowthState)


def test_growth_is_off_unless_the_recipe_bounds_it() -> None:
    target = "{kind: slurm, partition: p, nodes: 1, gpus_per_node: 2}"
    recipe = load_recipe_text(_recipe(target, 2), "spread.yaml")
    assert recipe.target.growth.max_jobs == 0  # type: ignore[union-attr]
    bad = _recipe(target.replace("}", ", growth: {max_jobs: -1}}"), 2)
    with pytest.raises(RecipeError, match=r"spread.yaml:\d+ target.growth.max_jobs"):
        load_recipe_text(bad, "spread.yaml")
