"""Bad input to `dynamoctl configure` gets one clear line and exit 1: a model neither
shipped nor local (offline), a system or engine version without data, targets nothing
meets, a GPU count that does not fit the target's nodes, the extra not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.configure.conftest import LLAMA_70B, SMALL, require_aic

require_aic()

from dynamoctl.cli import app  # noqa: E402
from dynamoctl.configure import aic  # noqa: E402

pytestmark = pytest.mark.configure
REPO = Path(__file__).resolve().parents[2]


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, ["configure", *args], env={"COLUMNS": "200"})
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())  # rich and click wrap long lines


def test_model_neither_shipped_nor_local(tmp_path: Path) -> None:
    out = tmp_path / "r.yaml"
    error = refused(*SMALL[2:], "--model", "example-org/not-a-model-7B", "--out", str(out))
    assert "not a model AI Configurator ships and not a local directory" in error
    assert "config.json" in error and "offline" in error
    assert "meta-llama/Meta-Llama-3.1-8B" in error  # the shipped ids are listed
    assert not out.exists()


def test_a_local_directory_with_config_json_works_offline(tmp_path: Path) -> None:
    shipped = Path(aic._module("aiconfigurator_core.sdk.utils")._get_model_config_path())
    model = tmp_path / "my-qwen"
    model.mkdir()
    (model / "config.json").write_text((shipped / "Qwen--Qwen3-8B_config.json").read_text())
    out = tmp_path / "r.yaml"
    result = CliRunner().invoke(
        app, ["configure", *SMALL[2:], "--model", str(model), "--out", str(out), "--tpot", "30"]
    )
    assert result.exit_code == 0, result.output
    assert str(model) in out.read_text()  # the recipe's model path is the directory
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in refused(*SMALL[2:], "--model", str(empty))


def test_system_and_engine_version_without_data() -> None:
    error = refused(*SMALL, "--system", "x100_sxm")
    assert "system x100_sxm: no performance data" in error
    assert "h100_sxm" in error and "b200_sxm" in error
    error = refused(*SMALL, "--engine-version", "0.0.1")
    assert "engine version 0.0.1: no vllm data on h100_sxm; versions:" in error
    assert "0.24.0" in error


def test_targets_no_configuration_meets_name_the_binding_one() -> None:
    error = refused(*SMALL, "--ttft", "5", "--tpot", "100")
    assert "meets TTFT 5 ms (best reachable" in error and "TPOT" not in error.split("meets")[1]
    error = refused(*SMALL, "--ttft", "1000", "--tpot", "1")
    assert "meets TPOT 1 ms (best reachable" in error


def test_gpu_counts_that_do_not_fit_the_nodes(tmp_path: Path) -> None:
    args = [a for a in LLAMA_70B if a not in ("16",)]
    error = refused(*args[: args.index("--gpus") + 1], "12", *args[args.index("--gpus") + 1 :])
    assert "--gpus 12 is not whole nodes of 8 GPUs; use 8 or 16" in error
    recipe = tmp_path / "two-nodes.yaml"
    recipe.write_text(
        "schema: 1\nname: two\ndiscovery: {backend: etcd, managed: true}\n"
        "target: {kind: slurm, partition: gpu, nodes: 2, gpus_per_node: 8}\n"
        "model: {name: m, path: m}\nworkers: {agg: {engine: vllm}}\n"
    )
    error = refused(*SMALL[:2], "--isl", "1000", "--osl", "100", "--from-recipe", str(recipe),
                    "--gpus", "32")  # fmt: skip
    assert "--gpus 32 do not fit the target: 2 node(s) x 8 GPUs = 16" in error


def test_workload_from_a_trace_and_a_bad_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i * 100, "input_length": 900 + 200 * (i % 2), "output_length": 128}
             for i in range(10)]  # fmt: skip
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "r.yaml"
    result = CliRunner().invoke(
        app, ["configure", *SMALL[:4], "--trace", str(trace), "--tpot", "30", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "ISL 1000, OSL 128" in out.read_text()  # the trace's means
    trace.write_text('{"timestamp": "soon"}\n')
    assert "--trace:" in refused(*SMALL[:4], "--trace", str(trace))
    assert "give --trace or --isl/--osl, not both" in refused(*SMALL, "--trace", str(trace))


def test_without_the_extra_the_message_names_the_install() -> None:
    hide = (
        "import sys; sys.modules['aiconfigurator'] = None; "
        "sys.modules['aiconfigurator_core'] = None; "
        "from dynamoctl.cli import main; sys.argv[0] = 'dynamoctl'; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide, "configure", *SMALL], cwd=REPO, env=os.environ.copy(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "pip install 'dynamoctl[configure]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_model_too_large_for_the_gpus_says_so() -> None:
    error = refused("--model", "meta-llama/Meta-Llama-3.1-405B", *SMALL[2:])
    assert "fits 1 x h100_sxm at any latency" in error and "give more GPUs" in error
