"""Every registry by name has the same manners (dynamoctl/util/registry.py)."""

from __future__ import annotations

import pytest

from dynamoctl.engines.registry import ENGINES, UnknownEngine
from dynamoctl.engines.spec import EngineSpec
from dynamoctl.frontend.routing import ROUTINGS
from dynamoctl.launch.registry import LAUNCHERS
from dynamoctl.router.errors import UnknownMode
from dynamoctl.router.policies import POLICIES
from dynamoctl.supervisor.probes import PROBES
from dynamoctl.util.registry import Registry, UnknownName

REGISTRIES = {
    "engine": (ENGINES, UnknownEngine),
    "router mode": (POLICIES, UnknownMode),
    "router": (ROUTINGS, ValueError),
    "target kind": (LAUNCHERS, UnknownName),
    "component probe": (PROBES, UnknownName),
}


@pytest.mark.parametrize("what", sorted(REGISTRIES))
def test_an_unknown_name_lists_the_valid_ones(what: str) -> None:
    registry, error = REGISTRIES[what]
    assert isinstance(registry, Registry) and registry.what == what
    with pytest.raises(error) as err:
        registry["no-such-thing"]
    assert str(err.value) == f"unknown {what} 'no-such-thing'; valid: {', '.join(registry.names())}"


def test_a_name_registered_twice_is_refused() -> None:
    registry: Registry[int] = Registry("thing")
    registry.add("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        registry.add("a", 2)


def test_every_engine_has_its_plan_rules() -> None:
    # An engine the workers can run is one the plan knows how to command: its spec holds
    # every rule, under its own name.
    assert all(isinstance(ENGINES[name], EngineSpec) for name in ENGINES)
    assert [ENGINES[name].name for name in ENGINES] == ENGINES.names()
    assert {"mocker", "vllm", "sglang", "trtllm"} <= set(ENGINES)
    assert set(PROBES) == {"etcd", "frontend", "router", "worker", "planner"}
