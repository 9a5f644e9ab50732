"""Locked by default (docs/security.md, "Locked by default"): ``dynamoctl up`` of a
multi-host recipe refuses, before anything starts, an OpenAI endpoint on a network address
without API keys and a plain ``http://`` external etcd, unless the recipe says it means
them (``security.open_endpoint``, ``discovery.allow_plaintext``); shipped multi-host
recipes name where their keys are, never a key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.recipe import load_recipe
from dynamoctl.supervisor.doors import open_doors

REPO = Path(__file__).resolve().parents[2]
HOSTS = "target: {kind: ssh, hosts: [10.255.0.1, 10.255.0.2], gpus_per_host: 0}\n"
BODY = """\
model: {name: mock-llama, path: mock-llama, block_size: 16}
workers:
  agg: {engine: mocker, replicas: 2, gpus_per_replica: 0}
"""


def up(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    recipe = tmp_path / "doors.yaml"
    recipe.write_text("schema: 1\nname: doors\n" + text)
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", "up", str(recipe), "--detach"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("discovery", "extra", "named"),
    [
        ("{backend: etcd, managed: true}", "frontend: {port: 8000}\n", "security.open_endpoint"),
        (
            "{backend: etcd, endpoints: [http://10.255.0.9:2379]}",
            "frontend: {port: 8000, api_keys_env: DOORS_KEYS}\n",
            "discovery.allow_plaintext",
        ),
    ],
)
def test_up_refuses_an_open_door_on_a_cluster(
    tmp_path: Path, discovery: str, extra: str, named: str
) -> None:
    result = up(tmp_path, f"discovery: {discovery}\n{HOSTS}{extra}{BODY}")
    assert result.returncode == 1
    assert named in result.stderr and "refused" in result.stderr, result.stderr
    assert not (tmp_path / "home" / "runs" / "doors" / "state.json").exists()  # nothing ran


def test_saying_so_opens_them_and_one_host_needs_nothing(tmp_path: Path) -> None:
    said = tmp_path / "said.yaml"
    said.write_text(
        "schema: 1\nname: said\ndiscovery: {backend: etcd, allow_plaintext: true, "
        "endpoints: [http://10.255.0.9:2379]}\n" + HOSTS + "frontend: {port: 8000}\n"
        "security: {open_endpoint: true}\n" + BODY
    )
    assert open_doors(load_recipe(said)) == []
    local = tmp_path / "local.yaml"
    local.write_text("schema: 1\nname: local\n" + BODY)
    assert open_doors(load_recipe(local)) == []


def test_shipped_multi_host_recipes_are_locked() -> None:
    multi = []
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        if not recipe.multi_host:
            continue
        multi.append(path.name)
        assert open_doors(recipe) == [], path.name
        assert recipe.frontend.api_keys_env or recipe.frontend.api_keys_file, path.name
        assert not recipe.security.open_endpoint, path.name
    assert len(multi) == 6, multi
