"""`dynamoctl configure` writes recipes that `recipe validate` and `up --dry-run` accept:
a 70B-class model on 2 x 8 H100 Slurm nodes, a small model on one local GPU; a
multi-node replica where an instance is larger than a node; a planner profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from tests.configure.conftest import LLAMA_70B, SMALL, require_aic

require_aic()

from dynamoctl.cli import app  # noqa: E402
from dynamoctl.configure.models import (  # noqa: E402
    Answer,
    Candidate,
    Parallel,
    Pool,
    Prediction,
    Question,
)
from dynamoctl.configure.recipe_out import build_recipe, dump_recipe, place  # noqa: E402
from dynamoctl.planner.perf import PerfModel, check_profile, load_profile  # noqa: E402
from dynamoctl.recipe.loader import load_recipe  # noqa: E402
from dynamoctl.recipe.targets import SlurmTarget  # noqa: E402

pytestmark = pytest.mark.configure
REPO = Path(__file__).resolve().parents[2]


def configure(*args: str) -> str:
    result = CliRunner().invoke(app, ["configure", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def validate_and_dry_run(recipe: Path, home: Path) -> str:
    """What an operator runs next: both must accept the recipe."""
    env = {**os.environ, "DYNAMOCTL_HOME": str(home)}
    for args in (["recipe", "validate", str(recipe)], ["up", "--dry-run", str(recipe)]):
        done = subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return done.stdout


def test_llama_70b_on_two_slurm_nodes(tmp_path: Path) -> None:
    out = tmp_path / "llama.yaml"
    printed = configure(*LLAMA_70B, "--out", str(out))
    assert "agg wins" in printed or "disagg wins" in printed  # the verdict
    recipe = load_recipe(out)
    assert isinstance(recipe.target, SlurmTarget)
    assert (recipe.target.nodes, recipe.target.gpus_per_node) == (2, 8)
    assert recipe.discovery.backend == "etcd"  # two hosts: embedded discovery cannot serve
    pools = recipe.workers.pools()
    used = sum(p.replicas * p.gpus_per_replica for p in pools.values())
    assert 0 < used <= 16
    for pool in pools.values():
        assert pool.engine == "vllm"
        assert (
            pool.engine_args["tensor-parallel-size"]
            * pool.engine_args.get("pipeline-parallel-size", 1)
            == pool.gpus_per_replica
        )
        assert pool.engine_args["max-num-seqs"] >= 1
    text = out.read_text()
    assert "AI Configurator" in text and "Predicted per unit" in text  # where figures came from
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = validate_and_dry_run(out, tmp_path / "home")
    workers = sum(p.replicas for p in pools.values())
    assert plan.count(" worker on node") == workers
    assert "node1" in plan  # the second node is used


def test_small_model_on_one_local_gpu(tmp_path: Path) -> None:
    out = tmp_path / "small.yaml"
    profile = tmp_path / "profile.json"
    configure(
        *SMALL, "--ttft", "300", "--tpot", "20", "--out", str(out), "--profile-out", str(profile)
    )
    recipe = load_recipe(out)
    assert recipe.target.kind == "local" and recipe.target.gpus == 1
    pool = recipe.workers.agg
    assert pool is not None and (pool.replicas, pool.gpus_per_replica) == (1, 1)
    assert pool.engine_args["tensor-parallel-size"] == 1
    plan = validate_and_dry_run(out, tmp_path / "home")
    assert "--tensor-parallel-size 1" in plan and "CUDA_VISIBLE_DEVICES=0" in plan
    # The planner reads the profile in its own format, for this pool.
    loaded = load_profile(profile)
    check_profile(loaded, model=recipe.model.name, engine="vllm", gpus_per_replica=1)
    # AI Configurator's KV capacity for the instance: more than its batch needs, less than
    # a whole 80 GiB GPU at Qwen3-8B's 144 KiB per token (36 layers x 8 KV heads x 128).
    assert loaded.kv_capacity_tokens is not None
    assert 56 * (1024 + 128) < loaded.kv_capacity_tokens < 80 * 2**30 // (36 * 8 * 128 * 2 * 2)
    model = PerfModel(loaded)
    assert model.prefill_seconds(2048) > model.prefill_seconds(512) > 0
    batch, itl = model.batch_within(0.020, 1100)
    assert batch > 1 and itl <= 0.020


def _candidate(tp: int, workers: int = 1) -> Candidate:
    return Candidate(
        mode="agg", rank=1, agg=Pool(parallel=Parallel(tp=tp), batch_size=64, workers=workers),
        gpus_per_unit=tp, units=2, concurrency=64,
        predicted=Prediction(ttft_ms=900, tpot_ms=40, tokens_per_s_gpu=100,
                             tokens_per_s_user=25, request_rate=1.0),
    )  # fmt: skip


def _answer(
    candidate: Candidate, gpus: int, model: str = "meta-llama/Meta-Llama-3.1-405B"
) -> Answer:
    question = Question(
        model=model, system="h100_sxm", engine="vllm",
        gpus=gpus, isl=4000, osl=500, ttft_ms=1000, tpot_ms=50,
    )  # fmt: skip
    return Answer(
        question=question, engine_version="0.24.0", candidates=(candidate,), fronts={},
        chosen="agg",
    )  # fmt: skip


def test_an_instance_larger_than_a_node_is_a_multi_node_replica(tmp_path: Path) -> None:
    target = SlurmTarget(kind="slurm", partition="gpu", nodes=4, gpus_per_node=8)
    candidate = _candidate(tp=16)
    answer = _answer(candidate, 32)
    units = place(candidate, target, "vllm")
    assert units == 2
    recipe = build_recipe(answer, candidate, units, name="big", served_name="big", target=target)
    pool = recipe.workers.agg
    assert pool is not None
    assert (pool.replicas, pool.nodes_per_replica, pool.gpus_per_replica) == (2, 2, 16)
    out = tmp_path / "big.yaml"
    out.write_text(dump_recipe(recipe, answer, candidate, units))
    plan = validate_and_dry_run(out, tmp_path / "home")
    assert "--nnodes 2" in plan
    # TensorRT-LLM instances cannot span nodes yet: nothing of this candidate is placed.
    assert place(candidate, target, "trtllm") == 0


def test_units_are_cut_to_what_the_nodes_hold() -> None:
    # Three TP8 units sized for 24 GPUs, but the allocation has two 8-GPU nodes.
    candidate = _candidate(tp=8).__class__(**{**_fields(_candidate(tp=8)), "units": 3})
    target = SlurmTarget(kind="slurm", partition="gpu", nodes=2, gpus_per_node=8)
    assert place(candidate, target, "vllm") == 2


def _fields(candidate: Candidate) -> dict[str, object]:
    return {name: getattr(candidate, name) for name in candidate.__struct_fields__}


def test_written_yaml_round_trips_through_the_loader(tmp_path: Path) -> None:
    target = SlurmTarget(kind="slurm", partition="gpu", nodes=1, gpus_per_node=8)
    candidate = _candidate(tp=4)
    answer = _answer(candidate, 8)
    recipe = build_recipe(answer, candidate, 2, name="rt", served_name="rt", target=target)
    text = dump_recipe(recipe, answer, candidate, 2)
    data = YAML(typ="safe").load(text)
    assert data["workers"]["agg"]["replicas"] == 2  # spelled out, though not the default
    assert "# 1 per unit x 2 unit(s)" in text


def test_every_engine_with_data_has_recipe_arguments() -> None:
    from dynamoctl.configure.models import ENGINES
    from dynamoctl.engines.registry import ENGINES as RUNNABLE

    with_args = {name for name in RUNNABLE if RUNNABLE[name].parallel_args is not None}
    assert with_args == set(ENGINES) <= set(RUNNABLE)


def test_ssh_hosts_become_the_target(tmp_path: Path) -> None:
    out = tmp_path / "ssh.yaml"
    configure(
        *SMALL[:2], "--isl", "1024", "--osl", "128", "--tpot", "30", "--target-kind", "ssh",
        "--hosts", "gpu-a,gpu-b", "--gpus-per-node", "1", "--gpus", "2", "--out", str(out),
    )  # fmt: skip
    recipe = load_recipe(out)
    assert recipe.target.kind == "ssh"
    assert recipe.target.hosts == ["gpu-a", "gpu-b"] and recipe.target.gpus_per_host == 1
    assert recipe.discovery.backend == "etcd"
    used = sum(p.replicas * p.gpus_per_replica for p in recipe.workers.pools().values())
    assert used == 2


def test_the_verify_deployment_of_a_disaggregated_configuration_is_valid(tmp_path: Path) -> None:
    from dynamoctl.configure.verify import mocker_recipe
    from dynamoctl.recipe.models import Recipe

    prefill = Pool(parallel=Parallel(tp=1), batch_size=1, workers=2)
    decode = Pool(parallel=Parallel(tp=2), batch_size=64, workers=1)
    disagg = Candidate(
        mode="disagg", rank=1, prefill=prefill, decode=decode, gpus_per_unit=4, units=2,
        concurrency=64, predicted=_candidate(tp=1).predicted,
    )  # fmt: skip
    answer = _answer(disagg, 8, model="meta-llama/Meta-Llama-3.1-8B")
    data = mocker_recipe(answer, disagg, 2, name="v", port=18000, speedup=0.5)
    recipe = Recipe.model_validate(data)
    assert recipe.workers.prefill is not None and recipe.workers.decode is not None
    assert (recipe.workers.prefill.replicas, recipe.workers.decode.replicas) == (4, 2)
    args = recipe.workers.decode.engine_args
    assert (args["perf-model"], args["aic-tp-size"], args["max-num-seqs"]) == ("aic", 2, 64)
    # The simulated GPU's KV cache: what AI Configurator's memory model leaves on 2 x H100
    # (80 GiB each, 90% for weights + KV; 8B weights ~16 GB), more than the batch needs.
    assert (
        64 * (4000 + 500)
        < args["num-gpu-blocks"] * 64
        < 2 * 80 * 2**30 // args["kv-bytes-per-token"]
    )
    assert args["kv-bytes-per-token"] == 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B, 16-bit
