"""Wedged instances beyond workers and frontends (docs/operations.md, "Wedged
instances"; issue 26): a gang whose follower is frozen is put down and restarted whole
(the leader still answers, its gang's step does not), and a frozen standalone router and
a frozen planner are WEDGED, SIGKILLed as a process group and restarted, each decision
logged by the supervisor and counted on its ``/metrics``; ``status`` names the wedge
while the instance is replaced. Real processes frozen with SIGSTOP, never resumed."""

from __future__ import annotations

from typing import Any

import httpx
import psutil
import pytest

from tests.supervisor.conftest import Cli, free_port, live_in_group
from tests.supervisor.test_gang_up import gang_recipe
from tests.supervisor.test_wedge import engine_of, restarted, samples

pytestmark = pytest.mark.timeout(300)  # two freezes, each replaced, on a loaded machine

ROUTER_AND_PLANNER = """\
schema: 1
name: {name}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}, router: {{mode: kv, replicas: 1}}}}
workers:
  agg:
    engine: mocker
    replicas: 1
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 1024, speedup-ratio: 10}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2}}
planner:
  mode: load
  ttft_target_ms: 150.0
  itl_target_ms: 1000.0
  agg_max_replicas: 1
"""


def row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in report["instances"] if r["name"] == name)


def freeze_until_replaced(cli: Cli, instance: str, *, back: str | None = None) -> dict[str, Any]:
    """SIGSTOP ``instance``'s process for good; the status once ``back`` (default: the
    instance itself) is READY again after one restart. Every status seen while it is
    replaced names the wedge."""
    frozen = engine_of(cli, instance)
    frozen.suspend()
    back = back or instance
    seen: list[dict[str, Any]] = []

    def replaced(report: dict[str, Any]) -> bool:
        seen.append(row(report, back))
        return bool(restarted(back, 1)(report))

    try:
        report = cli.wait_for(replaced, timeout=60, what=f"{back} restarted")
    finally:
        if frozen.is_running():
            frozen.kill()
    replacing = [r for r in seen if r["restarts"] == 1 and r["state"] != "READY"]
    replacing += [r for r in seen if r["restarts"] == 0 and r["state"] != "READY"]
    for r in replacing:  # WEDGED, then FAILED, BACKOFF, STARTING: each says why
        assert r["message"].startswith("wedged: "), r
    assert not psutil.pid_exists(frozen.pid) or frozen.status() == psutil.STATUS_ZOMBIE
    return report


@pytest.mark.gang
def test_a_gang_with_a_frozen_follower_is_restarted_whole(cli: Cli) -> None:
    port = free_port()
    up = cli("up", str(cli.recipe(gang_recipe("gangw", port, replicas=1))), "--detach",
             timeout=120)  # fmt: skip
    assert up.returncode == 0, up.stderr
    before = cli.status()
    leader_pid = row(before, "agg-0")["pid"]
    report = freeze_until_replaced(cli, "agg-0.1", back="agg-0")
    leader, follower = row(report, "agg-0"), row(report, "agg-0.1")
    assert leader["message"].startswith("wedged: its gang's step stalled for"), leader
    assert leader["last_exit"] in (137, -9)  # SIGKILL to the group: no SIGTERM grace
    assert follower["state"] == "READY" and follower["pid"] != row(before, "agg-0.1")["pid"]
    assert leader["pid"] != leader_pid and not live_in_group(leader_pid)
    moves = samples(cli, "gangw", "dynamoctl_supervisor_transitions_total")
    assert moves["agg-0/WEDGED"] == 1 and moves["agg-0.1/WEDGED"] == 1  # the gang as one
    assert samples(cli, "gangw", "dynamoctl_supervisor_restarts_total") == {"agg-0/wedge": 1.0}
    silences = samples(cli, "gangw", "dynamoctl_supervisor_probe_silences_total")
    assert silences["agg-0/wedged"] == 1
    log = (cli.home / "runs" / "gangw" / "supervisor.log").read_text()
    assert "agg-0 wedged: its gang's step stalled for" in log
    reply = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "mock-llama", "prompt": "hi", "max_tokens": 4},
        trust_env=False, timeout=30,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text


def test_a_frozen_router_and_planner_are_put_down_and_restarted(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(ROUTER_AND_PLANNER.format(name="rpw", port=port))
    up = cli("up", str(recipe), "--detach", timeout=120)
    assert up.returncode == 0, up.stderr
    for instance in ("router-0", "planner-0"):
        report = freeze_until_replaced(cli, instance)
        assert row(report, instance)["message"].startswith("wedged: answered no probe for")
        assert row(report, instance)["last_exit"] in (137, -9)
        moves = samples(cli, "rpw", "dynamoctl_supervisor_transitions_total")
        assert moves[f"{instance}/WEDGED"] == 1
    restarts = samples(cli, "rpw", "dynamoctl_supervisor_restarts_total")
    assert restarts == {"router-0/wedge": 1.0, "planner-0/wedge": 1.0}
    silences = samples(cli, "rpw", "dynamoctl_supervisor_probe_silences_total")
    assert silences["router-0/wedged"] == 1 and silences["planner-0/wedged"] == 1
    log = (cli.home / "runs" / "rpw" / "supervisor.log").read_text()
    for instance in ("router-0", "planner-0"):
        assert f"{instance} wedged: answered no probe for" in log
    reply = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "mock-llama", "prompt": "hi", "max_tokens": 4},
        trust_env=False, timeout=30,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text  # through the restarted router
    report = cli.status()
    assert {r["name"]: r["state"] for r in report["instances"]} == {
        "agg-0": "READY", "router-0": "READY", "frontend-0": "READY", "planner-0": "READY",
    }  # fmt: skip
