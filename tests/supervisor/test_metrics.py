"""The supervisor's ``/metrics``: a worker killed with -9 is counted as one restart, with its
reason, once it serves again; the endpoint needs no token while commands still do; and
Prometheus targets generated from discovery include it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor.conftest import REPO, Cli, free_port, mocker_recipe


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    reply = httpx.get(f"{url}/metrics", trust_env=False)  # no bearer token
    assert reply.status_code == 200, reply.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return found.get((name, frozenset(labels.items())), 0.0)


def test_restart_counted_after_kill(cli: Cli) -> None:
    recipe = cli.recipe(mocker_recipe("metered", free_port(), replicas=1))
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    state = json.loads((cli.home / "runs" / "metered" / "state.json").read_text())
    control = state["control"]
    ours = {"deployment": "metered", "instance": "agg-0", "component": "worker", "role": "agg"}

    before = samples(control)
    assert value(before, "dynamoctl_supervisor_restarts_total", **ours, reason="exit") == 0
    assert value(before, "dynamoctl_supervisor_instance_state", **ours, state="READY") == 1
    assert value(before, "dynamoctl_supervisor_instances", deployment="metered",
                 state="READY") == 2  # fmt: skip
    assert value(before, "dynamoctl_supervisor_phase", deployment="metered", phase="serving") == 1
    assert value(before, "dynamoctl_supervisor_restart_budget_left", **ours) == 5
    # Reading metrics is open; every command still needs the token.
    assert httpx.get(f"{control}/status", trust_env=False).status_code == 401
    assert httpx.post(f"{control}/drain", json={"target": "agg-0"}).status_code == 401

    keeper = psutil.Process(next(r["pid"] for r in cli.status()["instances"]
                                 if r["name"] == "agg-0"))  # fmt: skip
    os.kill(keeper.children()[0].pid, signal.SIGKILL)
    cli.wait_for(
        lambda r: any(x["name"] == "agg-0" and x["restarts"] == 1 and x["state"] == "READY"
                      for x in r["instances"]),
        what="agg-0 restarted",
    )  # fmt: skip
    after = samples(control)
    assert value(after, "dynamoctl_supervisor_restarts_total", **ours, reason="exit") == 1
    restarts = {k: v for k, v in after.items() if k[0] == "dynamoctl_supervisor_restarts_total"}
    assert sum(restarts.values()) == 1  # the frontend was not restarted, nothing else counted
    assert value(after, "dynamoctl_supervisor_instance_state", **ours, state="READY") == 1
    assert value(after, "dynamoctl_supervisor_restart_budget_left", **ours) == 4

    # Prometheus finds the supervisor through discovery, like every other component.
    out = cli.tmp / "targets.json"
    plan = state["plan"]
    made = subprocess.run(
        [sys.executable, "deploy/prometheus/targets.py", "--discovery", plan["discovery_url"],
         "--namespace", plan["namespace"], "--out", str(out)],
        cwd=REPO, env=cli.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    groups = json.loads(out.read_text())
    sup = [g for g in groups if g["labels"]["component"] == "supervisor"]
    assert [g["targets"] for g in sup] == [[control.removeprefix("http://")]]
    assert {g["labels"]["component"] for g in groups} == {"supervisor", "worker", "frontend"}

    assert cli("down").returncode == 0
