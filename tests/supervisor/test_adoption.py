"""A supervisor restarted without an outage (docs/operations.md, "Restarting the
supervisor"): SIGKILL it under a streaming load, ``up`` again, and the instances it left
are taken back, not restarted; with no new supervisor they stop after their orphan grace.
Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import openai
import psutil

from tests.supervisor.conftest import Cli, free_port, live_in_group, mocker_recipe, states


def _stream(base_url: str, stop: threading.Event, errors: list[str], done: list[int]) -> None:
    """Streaming chat completions until ``stop`` (bounded: 2,000 requests at most)."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=30)
    while not stop.is_set() and len(done) < 2000:
        try:
            stream = client.chat.completions.create(
                model="mock-llama",
                messages=[{"role": "user", "content": "tell me a story " * 8}],
                max_tokens=24,
                extra_body={"ignore_eos": True},  # exactly 24 tokens
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = [chunk.usage for chunk in stream if chunk.usage is not None]
            assert usage and usage[-1].completion_tokens == 24, usage
            done.append(1)
        except Exception as exc:
            errors.append(repr(exc))


def _until(check: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def test_killed_supervisor_under_load_is_taken_back_by_up(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(mocker_recipe("adopt", port, replicas=2, extra="  orphan_grace: 60\n"))
    assert cli("up", str(recipe), "--detach").returncode == 0
    before = cli.status()
    pids = {row["name"]: row["pid"] for row in before["instances"]}
    state_file = cli.home / "runs" / "adopt" / "state.json"
    first = json.loads(state_file.read_text())["supervisor_pid"]

    stop, errors, done = threading.Event(), list[str](), list[int]()
    base_url = f"http://127.0.0.1:{port}/v1"
    load = [threading.Thread(target=_stream, args=(base_url, stop, errors, done)) for _ in range(3)]
    for thread in load:
        thread.start()
    try:
        _until(lambda: len(done) >= 10, "requests served before the kill")
        os.kill(first, signal.SIGKILL)
        _until(lambda: not psutil.pid_exists(first), "the supervisor gone")
        served = len(done)
        _until(lambda: len(done) >= served + 30, "requests served without a supervisor")
        assert all(live_in_group(pid) for pid in pids.values())  # nothing stopped

        again = cli("up", str(recipe), "--detach")  # finds the keepers, adopts them
        assert again.returncode == 0, again.stdout + again.stderr
        served = len(done)
        _until(lambda: len(done) >= served + 10, "requests served after the adoption")
    finally:
        stop.set()
        for thread in load:
            thread.join(60)
    assert errors == []

    after = cli.status()
    assert after["phase"] == "serving"
    assert states(after) == {"agg-0": "READY", "agg-1": "READY", "frontend-0": "READY"}
    assert {row["name"]: row["pid"] for row in after["instances"]} == pids  # the same ones
    assert all(row["restarts"] == 0 for row in after["instances"])
    second = json.loads(state_file.read_text())["supervisor_pid"]
    assert second != first
    log = (cli.home / "runs" / "adopt" / "supervisor.log").read_text()
    assert "took back agg-0, agg-1, frontend-0 from the previous supervisor" in log

    # Restarts work afterwards: kill -9 the adopted worker process of agg-0.
    worker = psutil.Process(pids["agg-0"]).children()[0]
    os.kill(worker.pid, signal.SIGKILL)
    report = cli.wait_for(
        lambda r: any(
            x["name"] == "agg-0" and x["restarts"] == 1 and x["state"] == "READY"
            for x in r["instances"]
        ),
        what="adopted agg-0 restarted",
    )
    row = next(r for r in report["instances"] if r["name"] == "agg-0")
    assert row["last_exit"] == 128 + signal.SIGKILL  # reported through the lifeline
    assert row["pid"] != pids["agg-0"]
    client = openai.OpenAI(base_url=base_url, api_key="none")
    assert client.completions.create(model="mock-llama", prompt="x", max_tokens=2).usage

    assert cli("down").returncode == 0
    for pid in [row["pid"], pids["agg-1"], pids["frontend-0"], second]:
        assert live_in_group(pid) == [], pid


def test_adopt_names_what_it_cannot_take_back(cli: Cli) -> None:
    recipe = cli.recipe(mocker_recipe("nothing", free_port(), replicas=1))
    assert cli("up", str(recipe), "--detach").returncode == 0
    running = cli("adopt", "nothing")
    assert running.returncode == 1 and "has a running supervisor" in running.stderr
    assert cli("down", "nothing").returncode == 0
    stopped = cli("adopt", "nothing")
    assert stopped.returncode == 1 and "nothing of nothing is recorded as running" in stopped.stderr
