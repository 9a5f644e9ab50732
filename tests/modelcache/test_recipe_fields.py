"""``model.cache`` and ``workers.ROLE.load_format`` in a recipe: what the plan gives each
worker, and refusals naming the field and its line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dynamoctl.plan.build import build_plan
from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe import RecipeError, load_recipe_text

pytestmark = pytest.mark.fast_start


def recipe_text(engine: str = "vllm", cache: str = "", pool: str = "") -> str:
    return textwrap.dedent(f"""\
        schema: 1
        name: demo
        model:
          name: m
          path: /shared/models/m
        {cache}
        workers:
          agg:
            engine: {engine}
            gpus_per_replica: 0
            {pool}
        """)


def issue_of(text: str) -> str:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(text, "bad.yaml")
    [issue] = caught.value.issues
    return str(issue)


def test_the_worker_gets_the_cache_and_the_loader(tmp_path: Path) -> None:
    cache = "  cache: {dir: /local/models, max_bytes: 1000000000, fallback_to_shared: true}"
    recipe = load_recipe_text(
        recipe_text(cache=cache, pool="load_format: runai_streamer"), "good.yaml"
    )
    plan, _ = build_plan(recipe, tmp_path / "run")
    [worker] = [i for i in plan.instances if i.component == "worker"]
    argv = " ".join(worker.argv)
    assert "--model-cache-dir /local/models --model-cache-max-bytes 1000000000" in argv
    assert "--model-cache-fallback-to-shared" in argv
    assert "--load-format runai_streamer" in argv
    assert "--model /shared/models/m" in argv  # the worker points it at its copy


def test_no_cache_no_flags(tmp_path: Path) -> None:
    plan, _ = build_plan(load_recipe_text(recipe_text(), "good.yaml"), tmp_path / "run")
    [worker] = [i for i in plan.instances if i.component == "worker"]
    assert not any(a.startswith("--model-cache") for a in worker.argv)


@pytest.mark.parametrize(
    ("engine", "cache", "pool", "expected"),
    [
        ("vllm", "  cache: {dir: models}", "", "bad.yaml:6 model.cache.dir: 'models' must be"),
        ("vllm", "  cache: {max_bytes: 10}", "", "model.cache.dir: is required"),
        ("vllm", "  cache: {dir: /m, when_full: drop}", "", "model.cache.when_full"),
        ("mocker", "", "load_format: runai_streamer", "workers.agg.load_format: 'runai_stre"),
        ("sglang", "", "load_format: runai_streamer", "is not a loader of sglang (it has: auto"),
        ("vllm", "", "load_format: gguf2", "'gguf2' is not a loader of vllm"),
    ],
)
def test_bad_fields_are_refused_naming_them(
    engine: str, cache: str, pool: str, expected: str
) -> None:
    assert expected in issue_of(recipe_text(engine, cache, pool))


def test_engine_args_contradicting_load_format_are_refused() -> None:
    text = recipe_text(pool="load_format: safetensors")
    text = text.replace("load_format:", "engine_args: {load-format: pt}\n    load_format:")
    recipe = load_recipe_text(text, "good.yaml")
    with pytest.raises(Exception, match="contradicts load_format"):
        engine_arguments("agg", recipe.workers.pools()["agg"], recipe.model)
