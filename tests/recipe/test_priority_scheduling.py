"""A worker pool's ``priority_scheduling``: each engine's arguments (vLLM's own parser
reads them as its priority policy), the priority each adapter hands its engine, and the
refusal of an engine without it, naming the file, the line and the field."""

from __future__ import annotations

import textwrap

import pytest

from dynamoctl.engines.sglang import args as sargs
from dynamoctl.engines.vllm import args as vargs
from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe import RecipeError, load_recipe_text
from dynamoctl.wire.engine import GenerateRequest


def recipe_text(engine: str, on: bool = True) -> str:
    return textwrap.dedent(f"""\
        schema: 1
        name: demo
        model: {{name: m, path: org/m, block_size: 16}}
        workers:
          agg:
            engine: {engine}
            gpus_per_replica: 0
            priority_scheduling: {str(on).lower()}
        """)


def arguments(engine: str, on: bool = True) -> dict[str, object]:
    recipe = load_recipe_text(recipe_text(engine, on), "good.yaml")
    return engine_arguments("agg", recipe.workers.pools()["agg"], recipe.model)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", {"scheduling_policy": "priority"}),
        ("sglang", {"enable_priority_scheduling": True}),
        ("mocker", {"scheduling_policy": "priority"}),
    ],
)
def test_priority_scheduling_becomes_each_engines_arguments(
    engine: str, expected: dict[str, object]
) -> None:
    args = arguments(engine)
    assert {k: args[k] for k in expected} == expected
    off = arguments(engine, on=False)
    assert not set(expected) & set(off)


def test_an_engine_without_it_is_refused_by_name() -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(recipe_text("trtllm"), "bad.yaml")
    found = [str(issue) for issue in caught.value.issues]
    assert any(
        "bad.yaml:8 workers.agg.priority_scheduling: trtllm has no priority scheduling" in issue
        for issue in found
    ), found


def test_each_adapter_hands_its_engine_the_priority_its_way() -> None:
    urgent = GenerateRequest("r", [1, 2], 4, priority=5)
    # vLLM admits lower values first: dynamoctl's 5 goes ahead of 0 as -5.
    assert vargs.vllm_priority(urgent.priority) == -5
    # SGLang, higher first by default; nothing when it does not schedule by priority.
    assert sargs.priority_kwargs(urgent, {"enable_priority_scheduling": True}) == {"priority": 5}
    low_first = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True}
    assert sargs.priority_kwargs(urgent, low_first) == {"priority": -5}
    assert sargs.priority_kwargs(urgent, {}) == {}
