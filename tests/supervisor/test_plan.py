"""The plan: ``up --dry-run`` output is deterministic (golden files) and impossible
placements are refused before anything starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dynamoctl.launch.local import LocalLauncher
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.supervisor.plan import PlanError, build_plan, render
from tests.supervisor.conftest import REPO, Cli

GOLDEN = Path(__file__).parent / "golden"
HOME = "/srv/dynamoctl-home"


def dry_run(cli: Cli, recipe: Path) -> str:
    env_home = cli.home
    cli.home = Path(HOME)
    try:
        result = cli("up", str(recipe), "--dry-run")
    finally:
        cli.home = env_home
    assert result.returncode == 0, result.stderr
    return result.stdout.replace(sys.executable, "PYTHON")


@pytest.mark.parametrize(
    "recipe",
    [
        REPO / "recipes" / "local.yaml",
        Path(__file__).parent / "recipes" / "ssh.yaml",
        REPO / "recipes" / "llama70b-disagg.yaml",  # slurm, dry run outside an allocation
    ],
    ids=["local", "ssh", "slurm"],
)
def test_dry_run_matches_golden(cli: Cli, recipe: Path) -> None:
    text = dry_run(cli, recipe)
    golden = GOLDEN / recipe.name.replace(".yaml", ".txt")
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert not Path(HOME).exists()  # a dry run starts and creates nothing


def _recipe(workers: str, target: str = "target: {kind: local, gpus: 4}") -> str:
    return f"""\
schema: 1
name: p
{target}
model: {{name: m, path: m, block_size: 16}}
workers:
{workers}"""


def test_gpus_are_placed_contiguously_and_exported() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: vllm, replicas: 2, gpus_per_replica: 2}"), "r.yaml"
    )
    plan, gpu_map = build_plan(recipe, Path("/run"))
    workers = plan.by_pool("agg")
    assert [(w.host, w.gpus, w.env["CUDA_VISIBLE_DEVICES"]) for w in workers] == [
        ("localhost", [0, 1], "0,1"),
        ("localhost", [2, 3], "2,3"),
    ]
    assert gpu_map.take(1) is None  # all four taken


def test_more_gpus_than_the_hosts_have_is_refused() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: vllm, replicas: 3, gpus_per_replica: 2}"), "r.yaml"
    )
    with pytest.raises(PlanError, match=r"workers.agg.gpus_per_replica: replica 2 needs 2 GPU"):
        build_plan(recipe, Path("/run"))


def test_engine_args_contradicting_the_model_are_refused() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: mocker, gpus_per_replica: 0, engine_args: {block-size: 32}}"),
        "r.yaml",
    )
    with pytest.raises(PlanError, match=r"workers.agg.engine_args.block-size: 32 contradicts"):
        build_plan(recipe, Path("/run"))


def test_dry_run_names_the_bad_recipe_field(cli: Cli) -> None:
    bad = cli.recipe(
        _recipe("  agg: {engine: vllm, replicas: 1, gpus_per_replica: 8}"), "gpus.yaml"
    )
    result = cli("up", str(bad), "--dry-run")
    assert result.returncode == 1
    assert f"{bad}: workers.agg.gpus_per_replica" in result.stderr
    typo = cli.recipe(_recipe("  agg: {engine: mocker, replicaz: 1}"), "typo.yaml")
    result = cli("up", str(typo))
    assert result.returncode == 1
    assert f"{typo}:6 workers.agg.replicaz: unknown field" in result.stderr


def test_local_describe_wraps_the_command_in_a_keeper() -> None:
    recipe = load_recipe_text(_recipe("  agg: {engine: mocker, gpus_per_replica: 0}"), "r.yaml")
    plan, _ = build_plan(recipe, Path("/run"))
    text = render(plan, LocalLauncher().describe)
    assert "-m dynamoctl.launch.keeper -- " in text
    assert "--discovery embedded:///run/discovery" in text


def test_router_replicas_are_planned_before_the_frontend_that_asks_them() -> None:
    text = _recipe("  agg: {engine: mocker, gpus_per_replica: 0}").replace(
        "model:", "frontend: {router: {mode: kv, replicas: 2}}\nmodel:"
    )
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"))
    names = [spec.name for spec in plan.instances]
    assert names == ["agg-0", "router-0", "router-1", "frontend-0"]
    router = plan.by_pool("router")[0]
    assert router.argv[2:4] == ["dynamoctl", "router"] and "--label" in router.argv
    assert plan.by_pool("frontend")[0].argv[-2:] == ["--router", "standalone"]
