"""Adding an engine is its folder plus one registry line (docs/engines.md, "Adding an
engine"): a test-only engine (tests/engines/toy/spec.py), registered here, is accepted by
the recipe and commanded by the plan from its spec alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.engines import registry
from dynamoctl.plan.build import build_plan, render
from dynamoctl.recipe.loader import RecipeError, load_recipe_text
from tests.engines.toy import spec as toy

RECIPE = """\
schema: 1
name: toy
discovery: {backend: etcd, managed: true}
target:
  kind: ssh
  hosts: [h1, h2, h3]
  addresses: {h1: 192.0.2.1, h2: 192.0.2.2, h3: 192.0.2.3}
  gpus_per_host: 8
model: {name: m, path: /models/m}
workers:
  prefill: {engine: toy, gpus_per_replica: 8, kv_offload: {host_gib: 4}}
  decode: {engine: toy, nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {toy-parallel: 16}}
"""


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "ENGINES", registry.ENGINES.copy())
    registry.register_engine(toy.SPEC)  # the one registry line


def test_an_unregistered_engine_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(RecipeError, match=r"workers.prefill.engine: must be one of 'mocker'"):
        load_recipe_text(RECIPE, "toy.yaml")


@pytest.mark.usefixtures("with_toy")
def test_the_plan_commands_a_new_engine_from_its_spec_alone() -> None:
    recipe = load_recipe_text(RECIPE, "toy.yaml")
    plan, _ = build_plan(recipe, Path("/run"))
    text = render(plan, lambda spec: spec.argv)
    prefill, leader, follower = [s for s in plan.instances if s.pool != "etcd"][:3]
    # model arguments and kv_offload's, from the spec
    for flag in ("--checkpoint /models/m", "--alias m", "--page-size 64", "--host-cache-gib 4"):
        assert flag in " ".join(prefill.argv), flag
    assert prefill.env["TOY_TIERS"] == "1"
    # its side channel in the prefill pool's port block, the decode pool's above it
    assert prefill.ports == {"toy": 7100} and prefill.env["TOY_SIDE_CHANNEL"] == "192.0.2.1:7100"
    assert leader.ports["toy"] == 7200
    # a gang: rank flags and the host-IP variable from the spec, on each member
    assert (leader.name, follower.name, follower.component) == (
        "decode-0",
        "decode-0.1",
        "follower",
    )
    for member, rank in ((leader, 0), (follower, 1)):
        for flag in ("--world 2", f"--rank {rank}", "--leader 192.0.2.2:29501"):
            assert flag in " ".join(member.argv), (member.name, flag)
    assert (leader.env["TOY_HOST_IP"], follower.env["TOY_HOST_IP"]) == ("192.0.2.2", "192.0.2.3")
    assert "--engine toy" in " ".join(follower.argv)
    assert "TOY_HOST_IP=192.0.2.3" in text


@pytest.mark.usefixtures("with_toy")
def test_the_new_engines_parallel_sizes_must_fill_its_gang() -> None:
    bad = RECIPE.replace("toy-parallel: 16", "toy-parallel: 8")
    with pytest.raises(RecipeError, match=r"toy-parallel 8 = 8 GPUs but the replica has 2 nodes"):
        load_recipe_text(bad, "toy.yaml")
