"""Wedged instances under ``dynamoctl up`` (docs/operations.md, "Wedged instances"): a
process frozen by SIGSTOP (sockets open, nothing answers) is WEDGED, its process group
SIGKILLed and the instance restarted, a worker and a frontend alike, with the shipped
``wedge_timeout`` and ``hang_timeout``; a 3 s freeze costs no restart and no request."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor.conftest import Cli, completions_until, free_port

RECIPE = """\
schema: 1
name: {name}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: mocker
    replicas: 2
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 1024, speedup-ratio: 10}}
supervision:
  probe_interval: 0.3
  backoff_base: 0.2
"""


def samples(cli: Cli, name: str, metric: str) -> dict[str, float]:
    """``metric``'s samples on the supervisor's ``/metrics``, by ``instance/label``."""
    state = json.loads((cli.home / "runs" / name / "state.json").read_text())
    text = httpx.get(f"{state['control']}/metrics", trust_env=False).text
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric:
                tail = s.labels.get("to_state") or s.labels.get("reason") or s.labels["outcome"]
                found[f"{s.labels['instance']}/{tail}"] = s.value
    return found


def engine_of(cli: Cli, instance: str) -> psutil.Process:
    """The process the keeper of ``instance`` runs (the one a hang would freeze)."""
    row = next(r for r in cli.status()["instances"] if r["name"] == instance)
    return psutil.Process(row["pid"]).children()[0]


def restarted(instance: str, times: int) -> object:
    return lambda report: any(
        r["name"] == instance and r["restarts"] == times and r["state"] == "READY"
        for r in report["instances"]
    )


def test_a_frozen_worker_and_frontend_are_put_down_and_restarted(cli: Cli) -> None:
    port = free_port()
    up = cli("up", str(cli.recipe(RECIPE.format(name="wedge", port=port))), "--detach")
    assert up.returncode == 0, up.stderr
    for instance in ("agg-0", "frontend-0"):
        frozen = engine_of(cli, instance)
        frozen.suspend()  # SIGSTOP: it will never be resumed
        try:
            report = cli.wait_for(restarted(instance, 1), timeout=60, what=f"{instance} back")
        finally:
            if frozen.is_running():
                frozen.kill()
        row = next(r for r in report["instances"] if r["name"] == instance)
        assert row["message"].startswith("wedged: answered no probe for"), row
        assert row["last_exit"] in (137, -9)  # SIGKILL to the group: no SIGTERM grace
        assert not psutil.pid_exists(frozen.pid) or frozen.status() == psutil.STATUS_ZOMBIE
        moves = samples(cli, "wedge", "dynamoctl_supervisor_transitions_total")
        assert moves[f"{instance}/WEDGED"] == 1
        assert samples(cli, "wedge", "dynamoctl_supervisor_restarts_total") == {
            **({"agg-0/wedge": 1.0} if instance == "frontend-0" else {}),
            f"{instance}/wedge": 1.0,
        }
    silences = samples(cli, "wedge", "dynamoctl_supervisor_probe_silences_total")
    assert silences["agg-0/wedged"] == 1 and silences["frontend-0/wedged"] == 1
    reply = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "mock-llama", "prompt": "hi", "max_tokens": 4},
        trust_env=False, timeout=30,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text


def test_a_three_second_freeze_costs_no_restart_and_no_request(cli: Cli) -> None:
    port = free_port()
    up = cli("up", str(cli.recipe(RECIPE.format(name="stall", port=port))), "--detach")
    assert up.returncode == 0, up.stderr
    frozen = engine_of(cli, "agg-0")
    stop, errors, done = threading.Event(), list[str](), list[int]()
    load_args = (f"http://127.0.0.1:{port}/v1", stop, errors, done)
    load = [threading.Thread(target=completions_until, args=load_args) for _ in range(3)]
    for thread in load:
        thread.start()
    try:
        time.sleep(1.0)
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(frozen.pid, signal.SIGCONT)
        time.sleep(8.0)  # past the shipped wedge_timeout, counted from the freeze
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        stop.set()
        for thread in load:
            thread.join(60)
    assert errors == []
    assert len(done) > 10
    report = cli.status()
    assert {r["name"]: (r["state"], r["restarts"]) for r in report["instances"]} == {
        "agg-0": ("READY", 0), "agg-1": ("READY", 0), "frontend-0": ("READY", 0),
    }  # fmt: skip
    assert frozen.is_running() and frozen.status() != psutil.STATUS_STOPPED
    silences = samples(cli, "stall", "dynamoctl_supervisor_probe_silences_total")
    assert silences.get("agg-0/survived", 0) >= 1  # seen, logged, counted: not wedged
    assert not any(key.endswith("/wedged") for key in silences)
