"""The GPU smoke script's CPU-side parts, on any machine: arguments, and recipes that load
and whose engine arguments every adapter's translation accepts (the engines themselves
are not needed; ``tests/gpu/smoke.py`` needs a GPU to do more)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dynamoctl.engines.sglang import args as sargs
from dynamoctl.engines.trtllm import args as targs
from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.wire.engine_args import parse_engine_args, render_engine_args
from tests.gpu import smoke


def test_arguments() -> None:
    args = smoke.parse_args(["--engines", "sglang, vllm", "--gpu", "1"])
    assert (args.engines, args.gpu, args.dry_run) == (["sglang", "vllm"], 1, False)
    assert smoke.parse_args([]).engines == list(smoke.ENGINES)
    with pytest.raises(SystemExit):
        smoke.parse_args(["--engines", "vllm,tensorrt"])


def test_recipes_load_and_their_engine_arguments_translate(tmp_path: Path) -> None:
    plans = smoke.plans(tmp_path / "model", 3, smoke.ENGINES)
    assert sorted(plans) == ["smoke-sglang", "smoke-trtllm", "smoke-vllm", "smoke-vllm-pd"]
    for name, text in plans.items():
        recipe = load_recipe_text(text, f"{name}.yaml")
        pools = recipe.workers.pools()
        assert sorted(pools) == (["decode", "prefill"] if name.endswith("-pd") else ["agg"])
        for role, pool in pools.items():
            assert pool.env["CUDA_VISIBLE_DEVICES"] == "3"
            # What the worker receives: the supervisor's rendering, parsed back.
            options = parse_engine_args(
                render_engine_args(engine_arguments(role, pool, recipe.model))
            )
            assert options["block_size"] == smoke.BLOCK
            if pool.engine == "sglang":
                assert sargs.server_args(options, None)["page_size"] == smoke.BLOCK
            elif pool.engine == "trtllm":
                kwargs = targs.llm_kwargs(options)
                assert kwargs["kv_cache_config"]["tokens_per_block"] == smoke.BLOCK
            elif role != "agg":
                assert options["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    prefill, decode = (
        load_recipe_text(plans["smoke-vllm-pd"], "pd.yaml").workers.pools()[r].env
        for r in ("prefill", "decode")
    )
    assert prefill["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode["VLLM_NIXL_SIDE_CHANNEL_PORT"]


def test_dry_run_writes_validated_recipes_and_json(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    code = smoke.main(["--dry-run", "--workdir", str(tmp_path), "--out", str(out)])
    rows = json.loads(out.read_text())
    assert code == 0, rows
    assert {(r["deployment"], r["status"]) for r in rows} == {
        (f"smoke-{e}", "PASS") for e in ("vllm", "sglang", "trtllm", "vllm-pd", "vllm-2node")
    }
    assert (tmp_path / "smoke-trtllm.yaml").exists()
    assert (tmp_path / "tiny-llama" / "config.json").exists()


def test_the_multi_node_case_is_a_two_node_vllm_gang_pinned_by_its_nodes(tmp_path: Path) -> None:
    from dynamoctl.plan.build import build_plan

    text = smoke.gang_recipe(tmp_path / "model", 8123)
    recipe = load_recipe_text(text, "gang.yaml")
    pool = recipe.workers.pools()["agg"]
    assert (pool.engine, pool.nodes_per_replica, pool.gpus_per_replica) == ("vllm", 2, 0)
    # Each node's sshd sets CUDA_VISIBLE_DEVICES: nothing in the recipe may override it.
    assert "CUDA_VISIBLE_DEVICES" not in pool.env
    resolve = {"smoke-node1": "192.0.2.1", "smoke-node2": "192.0.2.2"}
    plan, _ = build_plan(recipe, tmp_path / "run", None, resolve)
    leader, follower = plan.by_pool("agg")
    assert (leader.host, follower.host, follower.component) == (
        "smoke-node1",
        "smoke-node2",
        "follower",
    )
    for spec in (leader, follower):
        assert "CUDA_VISIBLE_DEVICES" not in spec.env
        start = spec.argv.index("--") + 1 if spec.rank else spec.argv.index("--role") + 2
        options = parse_engine_args(spec.argv[start:])
        assert (options["tensor_parallel_size"], options["nnodes"]) == (2, 2)
        assert options["master_addr"] == "192.0.2.1"


def test_the_multi_node_case_is_skipped_not_failed_where_it_cannot_run(tmp_path: Path) -> None:
    results = smoke.Results()
    args = smoke.parse_args(["--engines", "vllm", "--gpus", "0,0"])
    smoke.run_gang_case(results, tmp_path / "model", tmp_path, args)
    assert [(r.deployment, r.status) for r in results.rows] == [(smoke.GANG, "SKIPPED")]
    assert "needs two distinct GPUs" in results.rows[0].detail and not results.failed
    if shutil.which("nvidia-smi") is None:  # this project's CI machines: no GPU at all
        assert "no NVIDIA GPU" in str(smoke.gang_skip_reason([0, 1]))
    with pytest.raises(SystemExit):
        smoke.parse_args(["--gpus", "a,b"])
