"""The plan: ``up --dry-run`` output is deterministic (golden files) and impossible
placements are refused before anything starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dynamoctl.launch.local import LocalLauncher
from dynamoctl.plan.build import PlanError, build_plan, render
from dynamoctl.recipe.loader import load_recipe_text
from tests.supervisor.conftest import REPO, Cli

GOLDEN = Path(__file__).parent / "golden"
HOME = "/srv/dynamoctl-home"


def dry_run(cli: Cli, recipe: Path, *declared: str) -> str:
    env_home = cli.home
    cli.home = Path(HOME)
    try:
        result = cli("up", str(recipe), "--dry-run", *declared)
    finally:
        cli.home = env_home
    assert result.returncode == 0, result.stderr
    return result.stdout.replace(sys.executable, "PYTHON")


SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))
# What a dry run of each recipe needs declared: the Slurm allocation's nodes and the
# addresses of names that do not resolve on a CI machine (documentation addresses).
DECLARED = {
    "llama70b-disagg": [
        *("--nodes", "gpu01,gpu02"),
        *("--resolve", "gpu01=192.0.2.11", "--resolve", "gpu02=192.0.2.12"),
    ],
    "vllm-tp16-2node": [
        *("--nodes", "gpu01,gpu02"),
        *("--resolve", "gpu01=192.0.2.31", "--resolve", "gpu02=192.0.2.32"),
    ],
    "deepseek-r1-wide-ep": [
        *("--nodes", ",".join(f"gpu{i:02d}" for i in range(1, 7))),
        *(arg for i in range(1, 7) for arg in ("--resolve", f"gpu{i:02d}=192.0.2.{40 + i}")),
    ],
    "sglang-tp16-2node": ["--resolve", "gpu-a=192.0.2.51", "--resolve", "gpu-b=192.0.2.52"],
    "trtllm-tp16-2node": [
        *("--nodes", "gpu01,gpu02"),
        *("--resolve", "gpu01=192.0.2.61", "--resolve", "gpu02=192.0.2.62"),
    ],
    "vllm-agg": ["--resolve", "gpu-node-1=192.0.2.21", "--resolve", "gpu-node-2=192.0.2.22"],
}


def golden_check(text: str, golden: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; UPDATE_GOLDEN=1 rewrites it"


def test_every_shipped_recipe_is_golden_tested() -> None:
    assert {p.stem for p in SHIPPED} <= {p.stem for p in GOLDEN.glob("*.txt")}


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda path: path.stem)
def test_shipped_recipe_dry_run_matches_golden(cli: Cli, recipe: Path) -> None:
    text = dry_run(cli, recipe, *DECLARED.get(recipe.stem, []))
    golden_check(text, GOLDEN / f"{recipe.stem}.txt")
    assert not Path(HOME).exists()  # a dry run starts and creates nothing
    # Commands that run on a cluster: etcd listens on addresses, nothing binds a name.
    assert "<node" not in text and "--listen-client-urls=http://gpu" not in text


def test_ssh_dry_run_matches_golden(cli: Cli) -> None:
    text = dry_run(cli, Path(__file__).parent / "recipes" / "ssh.yaml")
    golden_check(text, GOLDEN / "ssh.txt")


def test_slurm_dry_run_outside_an_allocation_is_symbolic(cli: Cli) -> None:
    text = dry_run(cli, REPO / "recipes" / "llama70b-disagg.yaml")
    golden_check(text, GOLDEN / "llama70b-disagg.symbolic.txt")
    assert "hosts node0, node1\n  (symbolic: the Slurm allocation's nodes" in text


def _recipe(workers: str, target: str = "target: {kind: local, gpus: 4}") -> str:
    return f"""\
schema: 1
name: p
{target}
model: {{name: m, path: m, block_size: 16}}
workers:
{workers}"""


def test_gpus_are_placed_contiguously_and_exported() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: vllm, replicas: 2, gpus_per_replica: 2}"), "r.yaml"
    )
    plan, gpu_map = build_plan(recipe, Path("/run"))
    workers = plan.by_pool("agg")
    assert [(w.host, w.gpus, w.env["CUDA_VISIBLE_DEVICES"]) for w in workers] == [
        ("localhost", [0, 1], "0,1"),
        ("localhost", [2, 3], "2,3"),
    ]
    assert gpu_map.take(1) is None  # all four taken


def test_more_gpus_than_the_hosts_have_is_refused() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: vllm, replicas: 3, gpus_per_replica: 2}"), "r.yaml"
    )
    with pytest.raises(PlanError, match=r"workers.agg.gpus_per_replica: replica 2 needs 2 GPU"):
        build_plan(recipe, Path("/run"))


def test_engine_args_contradicting_the_model_are_refused() -> None:
    recipe = load_recipe_text(
        _recipe("  agg: {engine: mocker, gpus_per_replica: 0, engine_args: {block-size: 32}}"),
        "r.yaml",
    )
    with pytest.raises(PlanError, match=r"workers.agg.engine_args.block-size: 32 contradicts"):
        build_plan(recipe, Path("/run"))


def test_dry_run_names_the_bad_recipe_field(cli: Cli) -> None:
    bad = cli.recipe(
        _recipe("  agg: {engine: vllm, replicas: 1, gpus_per_replica: 8}"), "gpus.yaml"
    )
    result = cli("up", str(bad), "--dry-run")
    assert result.returncode == 1
    assert f"{bad}: workers.agg.gpus_per_replica" in result.stderr
    typo = cli.recipe(_recipe("  agg: {engine: mocker, replicaz: 1}"), "typo.yaml")
    result = cli("up", str(typo))
    assert result.returncode == 1
    assert f"{typo}:6 workers.agg.replicaz: unknown field" in result.stderr


def test_local_describe_wraps_the_command_in_a_keeper() -> None:
    recipe = load_recipe_text(_recipe("  agg: {engine: mocker, gpus_per_replica: 0}"), "r.yaml")
    plan, _ = build_plan(recipe, Path("/run"))
    text = render(plan, LocalLauncher().describe)
    assert "-m dynamoctl.launch.keeper -- " in text  # orphan_grace 0: no lifeline socket
    adoptable = render(plan, LocalLauncher(orphan_grace=60).describe)
    assert "-m dynamoctl.launch.keeper --orphan-grace 60 --socket agg-0 -- " in adoptable
    assert "--discovery embedded:///run/discovery" in text


def test_router_replicas_are_planned_before_the_frontend_that_asks_them() -> None:
    text = _recipe("  agg: {engine: mocker, gpus_per_replica: 0}").replace(
        "model:", "frontend: {router: {mode: kv, replicas: 2}}\nmodel:"
    )
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"))
    names = [spec.name for spec in plan.instances]
    assert names == ["agg-0", "router-0", "router-1", "frontend-0"]
    router = plan.by_pool("router")[0]
    assert router.argv[2:4] == ["dynamoctl", "router"] and "--label" in router.argv
    frontend = plan.by_pool("frontend")[0].argv
    assert frontend[frontend.index("--router") + 1] == "standalone"


def test_frontend_processes_share_a_port_and_frontend_hosts_each_get_theirs() -> None:
    one = build_plan(load_recipe_text(_recipe("  agg: {engine: mocker}"), "r.yaml"), Path("/r"))
    alone = one[0].by_pool("frontend")
    cores = os.cpu_count() or 1
    assert len(alone) == max(1, min(8, cores // 4))  # the default leaves cores to workers
    text = _recipe("  agg: {engine: mocker, gpus_per_replica: 0}").replace(
        "model:", "frontend: {processes: 2}\nmodel:"
    )
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"))
    fronts = plan.by_pool("frontend")
    assert [f.name for f in fronts] == ["frontend-0", "frontend-1"]
    assert {f.ports["http"] for f in fronts} == {8000}
    for front in fronts:
        assert "--reuse-port" in front.argv and "--share-bookings" in front.argv
    # Two ssh hosts, one frontend each: their own addresses, bookings shared, no reuse.
    target = (
        "target: {kind: ssh, hosts: [a, b]}\n"
        "discovery: {backend: etcd, managed: true}\nsecurity: {open_endpoint: true}"
    )
    text = _recipe("  agg: {engine: mocker, gpus_per_replica: 0}", target).replace(
        "model:", "frontend: {hosts: 2, processes: 1}\nmodel:"
    )
    resolve = {"a": "192.0.2.1", "b": "192.0.2.2"}
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"), None, resolve)
    fronts = plan.by_pool("frontend")
    assert [(f.host, f.address) for f in fronts] == [("a", "192.0.2.1"), ("b", "192.0.2.2")]
    for front in fronts:
        assert "--share-bookings" in front.argv and "--reuse-port" not in front.argv


def test_frontend_hosts_beyond_the_target_are_refused() -> None:
    from dynamoctl.recipe.loader import RecipeError

    local = _recipe("  agg: {engine: mocker}").replace("model:", "frontend: {hosts: 2}\nmodel:")
    with pytest.raises(RecipeError, match=r"frontend\.hosts"):
        load_recipe_text(local, "r.yaml")
