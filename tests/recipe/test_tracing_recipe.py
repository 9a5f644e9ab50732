"""The recipe's ``tracing`` section: rendered into every component's ``--otlp-*`` flags
and into vLLM's own ``--otlp-traces-endpoint``; absent, no flag at all; an endpoint left
out is refused with the field's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.issues import RecipeError
from dynamoctl.recipe.loader import load_recipe_text

RECIPE = """\
schema: 1
name: p
target: {kind: local, gpus: 2}
model: {name: m, path: m, block_size: 16}
workers:
  agg: {engine: vllm, gpus_per_replica: 1}
"""
TRACED = RECIPE + "tracing: {endpoint: 'http://127.0.0.1:4318', sample_ratio: 0.25}\n"


def _argv(text: str) -> dict[str, list[str]]:
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"))
    return {spec.name: spec.argv for spec in plan.instances}


def test_tracing_reaches_every_component_and_vllm() -> None:
    plan, _ = build_plan(load_recipe_text(TRACED, "r.yaml"), Path("/run"))
    for spec in plan.instances:
        argv = " ".join(spec.argv)
        assert "--otlp-endpoint http://127.0.0.1:4318" in argv, spec.name
        assert "--otlp-sample-ratio 0.25" in argv, spec.name
    (worker,) = plan.by_pool("agg")
    argv = " ".join(worker.argv)
    assert "--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces" in argv
    assert worker.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"


def test_no_tracing_section_no_flag() -> None:
    for name, argv in _argv(RECIPE).items():
        assert not any("otlp" in arg for arg in argv), name


def test_tracing_without_endpoint_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"tracing.*endpoint.*required"):
        load_recipe_text(RECIPE + "tracing: {sample_ratio: 0.5}\n", "r.yaml")
