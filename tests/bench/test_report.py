"""Report files: JSON that loads back, real PNGs, a Markdown table; and the CLI end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.report import write_report
from dynamoctl.bench.result import BenchResult, RunResult, read_json
from dynamoctl.bench.schedule import RunOutcome
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.cli import app
from tests.bench.conftest import FakeServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def result() -> BenchResult:
    runs = []
    for concurrency in (1, 4):
        records = [
            RequestRecord(
                session=i,
                turn=0,
                start=i * 0.05,
                ttft=0.01 * (1 + i % 7),
                e2e=0.1 + 0.01 * (i % 5),
                gaps=[0.005, 0.006, 0.004],
                output_tokens=4,
                prompt_tokens=100,
                cached_tokens=40,
            )
            for i in range(60)
        ]
        records.append(RequestRecord(session=60, turn=0, start=3.0, error="http_503"))
        outcome = RunOutcome(records, issued=62, duration=3.2)
        summary = summarize(
            outcome, Slo(ttft_ms=50), label=f"c={concurrency}", concurrency=concurrency
        )
        runs.append(RunResult(summary, records))
    return BenchResult(
        version="0",
        started_at="2026-01-01T00:00:00+00:00",
        endpoint="http://x",
        model="m",
        api="completions",
        workload={"isl": "100"},
        runs=runs,
    )


def test_report_files_are_valid(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files = write_report(result(), tmp_path, plots=True)
    names = sorted(f.name for f in files)
    assert names == [
        "latency_cdf.png",
        "latency_vs_throughput.png",
        "report.md",
        "results.json",
        "throughput.png",
        "ttft_over_time.png",
    ]
    loaded = json.loads((tmp_path / "results.json").read_text())
    assert loaded["runs"][0]["summary"]["errors"] == {"http_503": 1, "unfinished": 1}
    assert read_json(tmp_path / "results.json") == result()
    for png in tmp_path.glob("*.png"):
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, png
    md = (tmp_path / "report.md").read_text()
    assert "| run | sent | ok | req/s |" in md
    assert "| c=4 | 62 | 60 |" in md
    assert "40.0%" in md  # prefix hits
    assert "![latency_cdf](latency_cdf.png)" in md


def test_cli_writes_report_against_a_server(fake_server: FakeServer, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            f"{fake_server.url}/v1",
            "--concurrency",
            "2,4",
            "--requests",
            "8",
            "--isl",
            "16",
            "--osl",
            "3",
            "--warmup",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "| c=2 | 8 | 8 |" in res.output
    assert len(fake_server.requests) == 2 * (2 + 8)  # warm-up requests are not reported
    summaries = [run["summary"] for run in json.loads((out / "results.json").read_text())["runs"]]
    assert [s["concurrency"] for s in summaries] == [2, 4]
    assert all((out / name).stat().st_size > 5000 for name in ("latency_cdf.png", "throughput.png"))


def test_cli_reads_endpoint_from_a_recipe(fake_server: FakeServer, tmp_path: Path) -> None:
    text = Path("recipes/local.yaml").read_text().replace("port: 8000", f"port: {fake_server.port}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    res = CliRunner().invoke(
        app,
        [
            "bench",
            str(recipe),
            "--requests",
            "2",
            "--osl",
            "2",
            "--no-plots",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert fake_server.requests[0]["model"] == "mock-llama"  # the recipe's model


def test_cli_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(app, ["bench", "http://127.0.0.1:9", "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "pip install 'dynamoctl[bench]'" in res.output
    assert not list(tmp_path.iterdir())  # refused before sending anything


def test_cli_refuses_two_load_shapes() -> None:
    res = CliRunner().invoke(app, ["bench", "http://x", "--concurrency", "2", "--rate", "3"])
    assert res.exit_code == 2
