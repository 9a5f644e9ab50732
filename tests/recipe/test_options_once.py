"""Each knob is declared once: the recipe's fields, the components' flags and the command
lines the plan renders all come from the models in dynamoctl.settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.frontend import Frontend, Router
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.router.policies import mode_names
from dynamoctl.settings import (
    ROUTER_MODES,
    AdmissionSettings,
    ApiKeySettings,
    DisaggSettings,
    HttpLimitSettings,
    ReplicaSettings,
    RouterSettings,
    flag,
    to_argv,
)

GROUPS = {
    "frontend": (
        RouterSettings,
        DisaggSettings,
        AdmissionSettings,
        ApiKeySettings,
        HttpLimitSettings,
    ),
    "router": (RouterSettings, ReplicaSettings),
}


def _help(component: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dynamoctl", component, "--help"],
        capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        check=True, timeout=60,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("component", sorted(GROUPS))
def test_every_field_is_a_flag_of_the_component(component: str) -> None:
    text = _help(component)
    for model in GROUPS[component]:
        for name in model.model_fields:
            assert flag(model, name) in text, (component, name)


def test_recipe_sections_are_the_components_options() -> None:
    for model in (RouterSettings, DisaggSettings, ReplicaSettings):
        assert issubclass(Router, model)
        for name, info in model.model_fields.items():  # same default, same docstring
            assert Router.model_fields[name].default == info.default
            assert Router.model_fields[name].description == info.description
    for group in (AdmissionSettings, ApiKeySettings, HttpLimitSettings):
        assert issubclass(Frontend, group)
    assert set(ROUTER_MODES) == set(mode_names())  # the schema's modes are the registry's


def test_the_plan_passes_every_knob_and_the_drain_timeout() -> None:
    recipe = load_recipe_text(
        """\
schema: 1
name: knobs
model: {name: m, path: m}
frontend:
  queue_timeout: 2.5
  max_queued: 7
  router: {mode: power-of-two, busy_kv_usage: 0.8, busy_waiting: 4, replicas: 1,
           max_prefill_attempts: 3, booking_ttl: 120, warm_up: 2}
workers:
  prefill: {engine: mocker, gpus_per_replica: 0}
  decode: {engine: mocker, gpus_per_replica: 0}
supervision: {drain_timeout: 25}
""",
        "k.yaml",
    )
    plan, _ = build_plan(recipe, Path("/run"))
    frontend = plan.by_pool("frontend")[0].argv
    router = plan.by_pool("router")[0].argv
    knobs = recipe.frontend.router
    for argv in (frontend, router):
        assert " ".join(
            to_argv(RouterSettings(**knobs.model_dump(include=set(RouterSettings.model_fields))))
        ) in " ".join(argv)
    assert frontend[frontend.index("--busy-kv-usage") :][:2] == ["--busy-kv-usage", "0.8"]
    assert frontend[frontend.index("--busy-waiting") :][:2] == ["--busy-waiting", "4"]
    assert frontend[frontend.index("--max-prefill-attempts") :][:2] == [
        "--max-prefill-attempts",
        "3",
    ]
    assert frontend[frontend.index("--queue-timeout") :][:4] == [
        "--queue-timeout",
        "2.5",
        "--max-queued",
        "7",
    ]
    # supervision.drain_timeout reaches the components: they finish before the SIGKILL.
    for spec in [*plan.by_pool("prefill"), *plan.by_pool("decode"), plan.by_pool("frontend")[0]]:
        assert spec.argv[spec.argv.index("--drain-grace") + 1] == "20.0", spec.name
