"""Every recipe shipped in recipes/ is valid and survives ``recipe show`` unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamoctl.cli.recipe import dump_json, dump_yaml
from dynamoctl.recipe import Recipe, load_recipe, load_recipe_text

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_the_documented_recipes_are_shipped() -> None:
    names = {path.name for path in RECIPES}
    assert {
        "local.yaml",
        "llama70b-disagg.yaml",
        "vllm-agg.yaml",
        "sglang-agg.yaml",
        "trtllm-agg.yaml",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda path: path.name)
def test_shipped_recipe_is_valid_and_round_trips(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem, "a recipe's name should match its file name"
    assert load_recipe_text(dump_yaml(recipe), "shown.yaml") == recipe
    assert Recipe.model_validate(json.loads(dump_json(recipe))) == recipe


def test_local_recipe_needs_no_infrastructure() -> None:
    recipe = load_recipe(next(path for path in RECIPES if path.name == "local.yaml"))
    assert recipe.discovery.backend == "embedded"
    assert recipe.target.kind == "local"
    assert {pool.engine for pool in recipe.workers.pools().values()} == {"mocker"}
    assert all(pool.gpus_per_replica == 0 for pool in recipe.workers.pools().values())


def test_disaggregated_recipe_uses_tensor_parallel_8_on_slurm() -> None:
    recipe = load_recipe(next(path for path in RECIPES if path.name == "llama70b-disagg.yaml"))
    assert recipe.target.kind == "slurm"
    pools = recipe.workers.pools()
    assert set(pools) == {"prefill", "decode"}
    for pool in pools.values():
        assert pool.engine_args["tensor-parallel-size"] == pool.gpus_per_replica == 8
        assert pool.engine_args["kv-transfer-config"]["kv_connector"] == "NixlConnector"
