"""``workers.ROLE.kv_offload``: each engine's translation, refusals naming the field and
its line, and the disk path checked on the node before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.local import LocalLauncher
from dynamoctl.plan.build import build_plan
from dynamoctl.plan.worker import engine_arguments
from dynamoctl.recipe import RecipeError, load_recipe, load_recipe_text

pytestmark = pytest.mark.kv_tiers

REPO = Path(__file__).resolve().parents[2]


def recipe_text(engine: str, offload: str, gpus: int = 1, engine_args: str = "{}") -> str:
    return textwrap.dedent(f"""\
        schema: 1
        name: demo
        model: {{name: m, path: org/m, block_size: 16}}
        workers:
          agg:
            engine: {engine}
            gpus_per_replica: {gpus}
            engine_args: {engine_args}
            kv_offload:
        """) + textwrap.indent(textwrap.dedent(offload), "      ")


def args_for(engine: str, offload: str, **kw: Any) -> dict[str, Any]:
    recipe = load_recipe_text(recipe_text(engine, offload, **kw), "good.yaml")
    pool = recipe.workers.pools()["agg"]
    return engine_arguments("agg", pool, recipe.model)


def issues(engine: str, offload: str, **kw: Any) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(recipe_text(engine, offload, **kw), "bad.yaml")
    return [str(issue) for issue in caught.value.issues]


def test_mocker_gets_tiers_in_blocks() -> None:
    # 16-token blocks of 128 KiB per token: 2 MiB per block.
    args = args_for(
        "mocker",
        "{host_gib: 2, disk_path: /var/tmp, disk_gib: 4, disk_offload_filter: false}",
        gpus=0,
        engine_args="{num-gpu-blocks: 1000}",
    )
    assert args["num_host_blocks"] == 1024
    assert args["num_disk_blocks"] == 2048
    assert (args["disk_path"], args["disk_offload_filter"]) == ("/var/tmp", False)


def test_vllm_native_on_gpus_and_lmcache_env() -> None:
    args = args_for("vllm", "{host_gib: 64}")
    assert (args["kv_offloading_size"], args["kv_offloading_backend"]) == (64, "native")
    args = args_for("vllm", "{host_gib: 8, backend: lmcache}")
    assert args["kv_offloading_backend"] == "lmcache"
    # The CPU build: an LMCache server started by the worker (engines/vllm/lmcache.py).
    assert args_for("vllm", "{host_gib: 0.5}", gpus=0)["lmcache_l1_gib"] == 0.5
    # ... and its disk tier, LMCache's file-system L2 (the server's --l2-adapter).
    args = args_for("vllm", "{host_gib: 0.5, disk_path: /var/tmp}", gpus=0)
    assert (args["lmcache_l1_gib"], args["lmcache_disk_path"]) == (0.5, "/var/tmp")


def test_sglang_hicache_and_trtllm_host_cache() -> None:
    args = args_for("sglang", "{host_gib: 10, disk_path: /var/tmp}")
    assert args["enable_hierarchical_cache"] is True
    assert args["hicache_size"] == 10  # whole GB (SGLang's --hicache-size is an int)
    assert args["hicache_write_policy"] == "write_through_selective"
    assert args["hicache_storage_backend"] == "file"
    args = args_for(
        "trtllm", "{host_gib: 1}", engine_args="{kv_cache_config: {free_gpu_memory_fraction: 0.8}}"
    )
    assert args["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8, "host_cache_size": 2**30}


@pytest.mark.parametrize(
    ("engine", "offload", "gpus", "expected"),
    [
        (
            "mocker",
            "{host_gib: 8, disk_path: /var/tmp, disk_gib: 4}",
            0,
            "bad.yaml:10 workers.agg.kv_offload.disk_gib: 4.0 GiB is smaller than "
            "host_gib (8.0 GiB): a tier must hold at least the tier above it, or it churns",
        ),
        (
            "mocker",
            "{host_gib: 1}",
            0,
            "workers.agg.kv_offload.host_gib: 1.0 GiB (512 blocks of 2097152 bytes) is "
            "smaller than the GPU KV cache (16384 blocks = 32 GiB): it would churn",
        ),
        ("vllm", "{host_gib: 4, backend: native}", 0, "kv_offload.backend: native offloading"),
        ("vllm", "{host_gib: 4, disk_path: /d, disk_gib: 8}", 0, "kv_offload.disk_gib: LMCache"),
        ("vllm", "{host_gib: 4, disk_path: /d}", 1, "kv_offload.disk_path: needs backend: lm"),
        ("trtllm", "{host_gib: 4, disk_path: /d}", 1, "kv_offload.disk_path: is not supported"),
        ("mocker", "{host_gib: 64, shared_store: x}", 0, "kv_offload.shared_store: is not sup"),
        ("sglang", "{host_gib: 4, backend: native}", 1, "kv_offload.backend: is not supported"),
    ],
)
def test_what_an_engine_cannot_do_is_refused_naming_the_field(
    engine: str, offload: str, gpus: int, expected: str
) -> None:
    [issue] = issues(engine, offload, gpus=gpus)
    assert expected in issue
    assert issue.startswith("bad.yaml:")


def test_engine_args_contradicting_kv_offload_are_refused() -> None:
    with pytest.raises(Exception, match="contradicts kv_offload"):
        args_for("vllm", "{host_gib: 4}", engine_args="{kv-offloading-size: 8}")


def test_shipped_recipe_shows_kv_offload() -> None:
    recipe = load_recipe(REPO / "recipes" / "local-kv-tiers.yaml")
    offload = recipe.workers.pools()["agg"].kv_offload
    assert offload is not None and offload.disk_path is not None


def hostcheck(paths: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "dynamoctl.launch.hostcheck", "", "[]", json.dumps(paths)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("dynamoctl-hostcheck "))
    return dict(json.loads(line.split(" ", 1)[1]))


def test_hostcheck_reports_unusable_paths(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("")
    result = hostcheck([str(tmp_path), str(tmp_path / "missing"), str(afile)])
    assert result["paths"] == {
        str(tmp_path / "missing"): "does not exist",
        str(afile): "is not a directory",
    }


async def test_missing_disk_path_fails_before_start_naming_host_and_path(tmp_path: Path) -> None:
    text = (REPO / "recipes" / "local-kv-tiers.yaml").read_text()
    missing = tmp_path / "no-such-dir"
    text = text.replace("disk_path: /var/tmp", f"disk_path: {missing}")
    recipe = load_recipe_text(text, "tiers.yaml")
    plan, _ = build_plan(recipe, tmp_path / "run")
    workers = plan.by_pool("agg")
    assert workers[0].paths == {"kv_offload.disk_path": str(missing)}
    with pytest.raises(LaunchError) as caught:
        await LocalLauncher().preflight(plan.instances)
    assert str(caught.value) == (
        f"agg-0: kv_offload.disk_path {missing} on localhost does not exist; create it there "
        "(writable by the deployment's user) or change the recipe"
    )
    missing.mkdir()
    await LocalLauncher().preflight(plan.instances)
