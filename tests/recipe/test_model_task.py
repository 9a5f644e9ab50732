"""``model.task: embed``: an embedding model's recipe becomes its engine's pooling flags
(vLLM's ``--runner pooling``, the mocker's ``--task embed``), and the pools and engines
that cannot serve one are refused naming the field."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe import RecipeError, load_recipe_text


def recipe_text(task: str, engine: str, pools: str = "agg") -> str:
    lines = [f"  {role}: {{engine: {engine}, gpus_per_replica: 0}}" for role in pools.split()]
    return (
        textwrap.dedent(f"""\
        schema: 1
        name: demo
        model: {{name: m, path: org/m, block_size: 16, task: {task}}}
        workers:
        """)
        + "\n".join(lines)
        + "\n"
    )


def args_for(task: str, engine: str) -> dict[str, Any]:
    recipe = load_recipe_text(recipe_text(task, engine), "good.yaml")
    return engine_arguments("agg", recipe.workers.pools()["agg"], recipe.model)


def test_embed_becomes_each_engines_pooling_flags() -> None:
    assert args_for("embed", "vllm")["runner"] == "pooling"
    assert args_for("embed", "mocker")["task"] == "embed"
    assert "runner" not in args_for("generate", "vllm")
    assert "task" not in args_for("generate", "mocker")


@pytest.mark.parametrize(
    ("engine", "pools", "field"),
    [("sglang", "agg", "workers.agg.engine"), ("mocker", "prefill decode", "workers.prefill")],
)
def test_what_cannot_serve_embeddings_is_refused(engine: str, pools: str, field: str) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(recipe_text("embed", engine, pools), "bad.yaml")
    text = " ".join(str(issue) for issue in caught.value.issues)
    assert field in text and "embed" in text
