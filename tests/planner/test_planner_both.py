"""The throughput loop live (issue 27, item 3): a disaggregated mocker deployment (one
prefill, one decode replica, on the real clock) is profiled by ``dynamoctl profile``; the
same deployment then runs with the planner in ``mode: both`` reading that profile. Under
a prefill-heavy load step the throughput loop raises the prefill pool's floor from the
forecast, to what the measured profile says that forecast needs (every throughput
decision's prefill and decode arithmetic is recomputed here from the file and the
decision's logged inputs), and the supervisor brings the new prefill replicas up; no
request fails."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.planner.ahead import rate_ahead
from dynamoctl.planner.perf import PerfModel, corrections, decode_need, load_profile, prefill_need
from dynamoctl.planner.records import Forecast, TrafficSample
from dynamoctl.planner.settings import PlannerSettings
from tests.planner.load import StepLoad
from tests.supervisor.conftest import Cli, free_port

pytestmark = [pytest.mark.planner, pytest.mark.timeout(300)]

PLANNER = {
    "mode": "both", "ttft_target_ms": 150.0, "itl_target_ms": 1000.0,
    "prefill_max_replicas": 3, "decode_max_replicas": 2, "gpu_budget": 5,
    "load_interval": 1.0, "throughput_interval": 4.0, "predictor": "constant",
    "cooldown": 2.0, "stable_intervals": 2,
}  # fmt: skip
"""The planner section: a TTFT target that one prefill replica misses under the heavy
clients (the profile's ~120 ms prefill of their ~3100-token prompts)."""


def recipe(port: int, planner: str = "") -> str:
    # Every request is prefilled remotely (required, from one token), so the heavy clients'
    # 1000-word prompts (~30 ms of simulated prefill each) load the prefill pool.
    return f"""\
schema: 1
name: both
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend:
  port: {port}
  queue_timeout: 60.0
  router: {{mode: kv, disaggregation: required, min_remote_prefill_tokens: 1, busy_kv_usage: null}}
workers:
  prefill:
    engine: mocker
    replicas: 1
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 8192, speedup-ratio: 1}}
  decode:
    engine: mocker
    replicas: 1
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 8192, speedup-ratio: 1}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, hang_timeout: 20, drain_timeout: 30}}
{planner}"""


def planner_section(profile: Path) -> str:
    fields = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in PLANNER.items())
    return f"planner:\n  profile: {json.dumps(str(profile))}\n{fields}\n"


def pools(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    planner = report.get("planner") or {"pools": []}
    return {pool["role"]: pool for pool in planner["pools"]}


def throughput_lines(log: str) -> list[tuple[dict[str, Any], str]]:
    """(inputs, reason) of every throughput decision the planner logged."""
    found = []
    for line in log.splitlines():
        match = re.search(r"throughput loop: .*?; inputs (\{.*?\}); (.*)$", line)
        if match and '"forecast":{' in match.group(1):
            found.append((json.loads(match.group(1)), match.group(2)))
    return found


def expected_reasons(inputs: dict[str, Any], profile: Path) -> tuple[str, str]:
    """What the profile says the logged forecast needs, per pool, as the decision states
    it: the forecast carried the logged lead time (one start-up, measured: longer on a
    loaded machine) along its trend, corrected by the observed interval's latencies
    against the profile."""
    settings = PlannerSettings.model_validate(PLANNER)
    model = PerfModel(load_profile(profile))
    forecast = Forecast(**inputs["forecast"])
    observed = TrafficSample(**inputs["observed"])
    assert inputs["lead_s"] >= settings.throughput_interval  # never less than an interval
    ahead = rate_ahead(forecast, inputs["lead_s"])
    prefill_factor, decode_factor = corrections(model, observed)
    prefill = prefill_need(model, ahead, settings.ttft_target, prefill_factor)
    decode = decode_need(model, ahead, settings.itl_target, decode_factor)
    return prefill.reason, decode.reason


def test_the_throughput_loop_sizes_prefill_from_a_measured_profile(cli: Cli) -> None:
    port = free_port()
    plain = cli.recipe(recipe(port), "plain.yaml")
    up = cli("up", str(plain), "--detach", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    profile = cli.tmp / "profile.json"
    done = cli(
        "profile", str(plain), "--pool", "decode", "--out", str(profile),
        "--isl", "256,1024,2048", "--batch", "1,2,4", "--context", "512,1536",
        "--osl", "64", "--repeats", "2", timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert cli("down", "both", timeout=90).returncode == 0

    planned = cli.recipe(recipe(port, planner_section(profile)), "planned.yaml")
    up = cli("up", str(planned), "--detach", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    cli.wait_for(lambda r: (r.get("planner") or {}).get("phase") == "planning", 30, "planning")
    with StepLoad(f"http://127.0.0.1:{port}/v1") as load:
        raised = cli.wait_for(
            lambda r: pools(r).get("prefill", {}).get("floor", 0) >= 2, 90, "a prefill floor"
        )
        grown = cli.wait_for(
            lambda r: (
                sum(row["pool"] == "prefill" and row["state"] == "READY" for row in r["instances"])
                >= 2
            ),
            60,
            "a second prefill replica READY",
        )
        time.sleep(PLANNER["throughput_interval"] + 1)  # one more decision under the load
    log = (cli.home / "runs" / "both" / "logs" / "planner-0.log").read_text()
    print(log)  # the decisions and their inputs, shown when the test fails
    assert load.errors == [], load.errors[:3]
    assert len(load.done) > 50
    assert "planning both" in log
    assert pools(raised)["prefill"]["floor"] <= PLANNER["prefill_max_replicas"]
    decided = throughput_lines(log)
    assert decided, "no throughput decision with a forecast logged"
    raising = [r for _, r in decided if re.search(r"-> [2-9]\b", r.split("; decode: ")[0])]
    assert raising, [r for _, r in decided]
    for inputs, reason in decided:
        prefill, decode = expected_reasons(inputs, profile)
        assert prefill in reason and decode in reason, (reason, prefill, decode)
    assert grown["planner"]["gpus"] <= PLANNER["gpu_budget"]
    assert cli("down", "both", timeout=90).returncode == 0
