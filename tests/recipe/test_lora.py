"""A worker pool's ``lora`` section: engine arguments per engine, and refusals that name
the file, the line and the field."""

from __future__ import annotations

import textwrap

import pytest

from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe import RecipeError, load_recipe_text


def recipe_text(engine: str, lora: str) -> str:
    return textwrap.dedent(f"""\
        schema: 1
        name: demo
        model: {{name: m, path: org/m, block_size: 16}}
        workers:
          agg:
            engine: {engine}
            gpus_per_replica: 0
            lora:
        """) + textwrap.indent(textwrap.dedent(lora), "      ")


def issues(engine: str, lora: str) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(recipe_text(engine, lora), "bad.yaml")
    return [str(issue) for issue in caught.value.issues]


def test_lora_becomes_each_engines_arguments() -> None:
    section = """\
        max_loras: 3
        max_rank: 32
        adapters: [{name: sql, path: /adapters/sql}]
        """
    vllm = load_recipe_text(recipe_text("vllm", section), "good.yaml")
    args = engine_arguments("agg", vllm.workers.pools()["agg"], vllm.model)
    assert (args["enable_lora"], args["max_loras"], args["max_lora_rank"]) == (True, 3, 32)
    mocker = load_recipe_text(recipe_text("mocker", section), "good.yaml")
    args = engine_arguments("agg", mocker.workers.pools()["agg"], mocker.model)
    assert args["max_loras"] == 3 and "enable_lora" not in args


@pytest.mark.parametrize(
    ("engine", "section", "expected"),
    [
        ("sglang", "{max_loras: 2}", "bad.yaml:8 workers.agg.lora: sglang adapters are not"),
        ("trtllm", "{max_loras: 2}", "bad.yaml:8 workers.agg.lora: trtllm adapters are not"),
        (
            "mocker",
            "adapters: [{name: a/b, path: /x}]",
            "bad.yaml:9 workers.agg.lora.adapters[0].name: 'a/b': use letters",
        ),
        (
            "mocker",
            "adapters: [{name: a, path: /x}, {name: a, path: /y}]",
            "workers.agg.lora.adapters[1].name: 'a' is declared twice",
        ),
        (
            "mocker",
            "{max_loras: 1, adapters: [{name: a, path: /x}, {name: b, path: /y}]}",
            "workers.agg.lora.adapters: 2 adapters, but max_loras is 1",
        ),
        ("mocker", "{max_loras: 0}", "workers.agg.lora.max_loras"),
        ("mocker", "{adapters: [{name: a}]}", "bad.yaml:9 workers.agg.lora.adapters[0].path"),
    ],
)
def test_bad_lora_sections_are_refused_naming_the_field(
    engine: str, section: str, expected: str
) -> None:
    found = issues(engine, section)
    assert any(expected in issue for issue in found), found
