"""`dynamoctl configure --verify` on a small configuration: the recommended deployment
really runs (mocker workers on AI Configurator's timing, started by `dynamoctl up`), the
load completes, and simulated figures land near the predicted ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.configure.conftest import SMALL, require_aic

require_aic()

from dynamoctl.cli import app  # noqa: E402
from dynamoctl.recipe.loader import load_recipe  # noqa: E402

pytestmark = [pytest.mark.configure, pytest.mark.timeout(300)]


def test_verify_runs_the_configuration_and_compares(tmp_path: Path) -> None:
    out = tmp_path / "small.yaml"
    # A tight TPOT target keeps the batch (and so the test) small: concurrency 8.
    result = CliRunner().invoke(
        app,
        ["configure", *SMALL, "--ttft", "300", "--tpot", "8", "--out", str(out),
         "--verify", "--verify-rounds", "3"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = result.output
    rows = {}
    for name in ("TTFT ms", "TPOT ms", "tok/s/GPU", "requests in flight"):
        match = re.search(rf"{re.escape(name)}\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│", text)
        assert match, f"no {name} row in:\n{text}"
        rows[name] = (float(match.group(1)), float(match.group(2)))
    sent = re.search(r"(\d+)/(\d+) requests", text)
    assert sent and sent.group(1) == sent.group(2) and int(sent.group(1)) >= 16
    # The simulation runs AI Configurator's own step times: per-token latency and output
    # rate stay within a factor of 2 of its prediction (measured: 0.8-1.1, docs/configure.md).
    for name in ("TPOT ms", "tok/s/GPU"):
        predicted, simulated = rows[name]
        assert 0.5 < simulated / predicted < 2.0, (name, predicted, simulated)
    assert rows["TTFT ms"][1] > 0
    # The deployment it ran is kept, and is a valid recipe of mockers on that timing.
    mocker = load_recipe(out.with_suffix(".verify.yaml"))
    pool = mocker.workers.agg
    assert pool is not None and pool.engine == "mocker"
    assert pool.engine_args["perf-model"] == "aic"
    assert pool.engine_args["aic-model"] == "Qwen/Qwen3-8B"
