"""``dynamoctl bench RECIPE`` reaches the recipe's frontend where ``up`` says it serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.bench.runner import authorized, endpoint_of


def _recipe(tmp_path: Path, frontend: str, target: str = "{kind: local}") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"""\
schema: 1
name: r
target: {target}
discovery: {{backend: etcd, managed: true}}
model: {{name: m, path: m}}
frontend: {frontend}
workers:
  agg: {{engine: mocker, gpus_per_replica: 0}}
""")
    return path


def test_a_recipe_without_a_frontend_host_is_benched_where_up_serves(tmp_path: Path) -> None:
    endpoint, model, key = endpoint_of(str(_recipe(tmp_path, "{port: 8123}")))
    assert (endpoint.base_url, model, key) == ("http://127.0.0.1:8123", "m", None)
    wildcard, _, _ = endpoint_of(str(_recipe(tmp_path, "{host: 0.0.0.0, port: 8124}")))
    assert wildcard.base_url == "http://127.0.0.1:8124"
    remote = _recipe(
        tmp_path,
        "{port: 8125}",
        "{kind: ssh, hosts: [gpu-a, gpu-b], addresses: {gpu-a: 192.0.2.1, gpu-b: 192.0.2.2}}",
    )
    assert endpoint_of(str(remote))[0].base_url == "http://gpu-a:8125"


def test_a_slurm_recipe_asks_for_the_url(tmp_path: Path) -> None:
    slurm = _recipe(tmp_path, "{port: 8126}", "{kind: slurm, partition: p, gpus_per_node: 0}")
    with pytest.raises(ValueError, match=r"known only inside its allocation.*pass the endpoint"):
        endpoint_of(str(slurm))


def test_a_recipe_with_api_keys_is_benched_with_its_first_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ours\nsk-first\nsk-second\n")
    recipe = _recipe(tmp_path, f"{{port: 8127, api_keys_file: {keys}}}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    assert endpoint_of(str(recipe)).api_key == "sk-first"
    assert endpoint_of("http://127.0.0.1:8127/v1").api_key == "sk-not-this-one"
    assert authorized({"authorization": "Bearer mine"}, "sk-first") == {
        "authorization": "Bearer mine"
    }
    assert authorized({}, "sk-first") == {"Authorization": "Bearer sk-first"}
