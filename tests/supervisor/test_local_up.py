"""``dynamoctl up`` on the local target, end to end: real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import psutil

from tests.supervisor.conftest import (
    Cli,
    completions_until,
    free_port,
    live_in_group,
    mocker_recipe,
    states,
)


def test_up_serve_drain_restart_down(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(mocker_recipe("life", port, replicas=2))
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    assert f"http://127.0.0.1:{port}/v1" in up.stdout

    # An official OpenAI client gets an answer.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    chat = client.chat.completions.create(
        model="mock-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.usage is not None and chat.usage.completion_tokens == 4

    report = cli.status()
    assert states(report) == {"agg-0": "READY", "agg-1": "READY", "frontend-0": "READY"}
    assert report["phase"] == "serving"
    pgids = {row["name"]: row["pid"] for row in report["instances"]}

    # Drain agg-1 under a bounded load: no request fails, agg-1 ends STOPPED, not restarted.
    stop, errors, done = threading.Event(), [], []
    load_args = (f"http://127.0.0.1:{port}/v1", stop, errors, done)
    load = [threading.Thread(target=completions_until, args=load_args) for _ in range(3)]
    for thread in load:
        thread.start()
    try:
        time.sleep(1.0)
        drained = cli("drain", "agg-1")
        assert drained.returncode == 0, drained.stderr
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in load:
            thread.join(60)
    assert errors == []
    assert len(done) > 10
    report = cli.status()
    assert states(report)["agg-1"] == "STOPPED"
    row = next(r for r in report["instances"] if r["name"] == "agg-1")
    assert row["restarts"] == 0 and row["pid"] is None
    assert live_in_group(pgids["agg-1"]) == []

    # kill -9 the worker process of agg-0 (the keeper's child): restarted, counted.
    keeper = psutil.Process(pgids["agg-0"])
    worker = keeper.children()[0]
    os.kill(worker.pid, signal.SIGKILL)
    report = cli.wait_for(
        lambda r: any(
            x["name"] == "agg-0" and x["restarts"] == 1 and x["state"] == "READY"
            for x in r["instances"]
        ),
        what="agg-0 restarted",
    )
    row = next(r for r in report["instances"] if r["name"] == "agg-0")
    assert row["last_exit"] in (137, -9)
    new_pgid = row["pid"]
    assert new_pgid != pgids["agg-0"]
    assert client.completions.create(model="mock-llama", prompt="x", max_tokens=2).usage

    # down: every process group is gone and the supervisor released the deployment.
    state = json.loads((cli.home / "runs" / "life" / "state.json").read_text())
    supervisor = state["supervisor_pid"]
    down = cli("down")
    assert down.returncode == 0, down.stderr
    for pgid in [new_pgid, pgids["frontend-0"], supervisor]:
        assert live_in_group(pgid) == [], pgid
    assert not psutil.pid_exists(supervisor) or (
        psutil.Process(supervisor).status() == psutil.STATUS_ZOMBIE
    )
    assert cli("status", "life").returncode == 3  # known, not running
    unnamed, named = cli("status"), cli("status", "life")  # the only one: the same answer
    assert (unnamed.returncode, unnamed.stdout) == (named.returncode, named.stdout)
    # Probes (several a second) are not logged at INFO; the supervisor's own lines are.
    log = (cli.home / "runs" / "life" / "supervisor.log").read_text()
    assert "serving mock-llama" in log and "HTTP Request" not in log


def test_second_up_is_refused_and_killed_supervisor_leaves_nothing(cli: Cli) -> None:
    grace = "  orphan_grace: 3\n"
    recipe = cli.recipe(mocker_recipe("twice", free_port(), replicas=1, extra=grace))
    assert cli("up", str(recipe), "--detach").returncode == 0
    again = cli("up", str(recipe), "--detach")
    assert again.returncode == 1
    assert "deployment 'twice' is already up" in again.stderr
    report = cli.status()
    groups = [row["pid"] for row in report["instances"]]
    state = json.loads((cli.home / "runs" / "twice" / "state.json").read_text())
    assert state["control"].startswith("http://127.0.0.1:")  # local: loopback only

    # Commands the supervisor refuses, each with the reason.
    unknown = cli("drain", "nosuch")
    assert unknown.returncode == 1
    assert "no running instance or pool named 'nosuch'" in unknown.stderr
    no_pool = cli("scale", "decode=2")
    assert no_pool.returncode == 1 and "no worker pool 'decode'" in no_pool.stderr
    forged = httpx.post(f"{state['control']}/down", headers={"authorization": "Bearer x"})
    assert forged.status_code == 401
    assert cli.status()["phase"] == "serving"

    # SIGKILL the supervisor: each keeper sees its lifeline close, keeps its instance for
    # the orphan grace (3 s) in case a new supervisor adopts it, then stops it.
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    killed = time.monotonic()
    while psutil.pid_exists(state["supervisor_pid"]):
        time.sleep(0.05)
    if time.monotonic() - killed < 2.0:  # too loaded a machine to tell otherwise
        assert all(live_in_group(g) for g in groups)
    deadline = time.monotonic() + 20
    while any(live_in_group(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [g for g in groups if live_in_group(g)] == []
    for name in ("agg-0", "frontend-0"):
        log = (cli.home / "runs" / "twice" / "logs" / f"{name}.log").read_text()
        assert "[keeper] no supervisor for 3 s: stopping the instance" in log, log[-2000:]
    down = cli("down", "twice")
    assert down.returncode == 0
    assert "supervisor gone" in down.stdout


def test_port_in_use_is_refused_before_anything_starts(cli: Cli) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        recipe = cli.recipe(mocker_recipe("busy", port, replicas=1))
        result = cli("up", str(recipe), "--detach")
    assert result.returncode == 1
    assert f"frontend-0: port {port} (http) on localhost is already in use" in result.stderr
    assert not (cli.home / "runs" / "busy" / "logs" / "agg-0.log").exists()


def test_crash_at_start_rolls_back_with_the_log_tail(cli: Cli) -> None:
    recipe = cli.recipe(
        mocker_recipe("crash", free_port(), replicas=2).replace(
            "speedup-ratio: 10", "speedup-ratio: 10, no-such-option: 1"
        )
    )
    result = cli("up", str(recipe), "--detach")
    assert result.returncode == 1
    assert "failed to start" in result.stderr
    assert "no_such_option" in result.stderr or "no-such-option" in result.stderr
    assert "rolled back" in result.stderr
    state = json.loads((cli.home / "runs" / "crash" / "state.json").read_text())
    assert state["phase"] == "failed" and state["records"] == {}


def test_hung_worker_is_restarted(cli: Cli) -> None:
    """SIGSTOP a worker: it stops answering probes, so after wedge_timeout it is WEDGED,
    SIGKILLed and replaced."""
    recipe = cli.recipe(mocker_recipe("hang", free_port(), replicas=1))
    assert cli("up", str(recipe), "--detach").returncode == 0
    keeper = psutil.Process(cli.status()["instances"][0]["pid"])
    worker = keeper.children()[0]
    worker.suspend()
    try:
        report = cli.wait_for(
            lambda r: r["instances"][0]["restarts"] >= 1 and r["instances"][0]["state"] == "READY",
            timeout=45,
            what="the hung worker replaced",
        )
    finally:
        if worker.is_running():
            worker.kill()
    assert report["instances"][0]["pid"] != keeper.pid
    assert "wedged: answered no probe" in report["instances"][0]["message"]
    assert cli("down", "--now").returncode == 0


def test_standalone_router_replicas_are_supervised(cli: Cli) -> None:
    """``frontend.router.replicas: 2`` starts two ``dynamoctl router`` processes before the
    frontend, which asks them; a router killed with -9 is restarted and requests go on."""
    port = free_port()
    recipe = cli.recipe(
        mocker_recipe("routed", port, replicas=2).replace(
            f"frontend: {{port: {port}}}",
            f"frontend: {{port: {port}, router: {{mode: kv, replicas: 2}}}}",
        )
    )
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    report = cli.status()
    assert states(report) == {
        "agg-0": "READY",
        "agg-1": "READY",
        "router-0": "READY",
        "router-1": "READY",
        "frontend-0": "READY",
    }
    frontend = next(r for r in report["instances"] if r["name"] == "frontend-0")
    argv = " ".join(psutil.Process(frontend["pid"]).children()[0].cmdline())
    assert "--router standalone" in argv
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
    assert client.completions.create(model="mock-llama", prompt="a", max_tokens=2).usage

    router = next(r for r in report["instances"] if r["name"] == "router-0")
    psutil.Process(router["pid"]).children()[0].kill()
    for _ in range(10):  # the other replica answers while router-0 comes back
        out = client.completions.create(
            model="mock-llama", prompt="b", max_tokens=2, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None and out.usage.completion_tokens == 2
    cli.wait_for(
        lambda r: any(x["name"] == "router-0" and x["restarts"] == 1 and x["state"] == "READY"
                      for x in r["instances"]),
        what="router-0 restarted",
    )  # fmt: skip
    assert cli("down").returncode == 0


def test_a_frontend_with_api_keys_is_supervised_and_refuses_strangers(cli: Cli) -> None:
    """The supervisor's readiness probe asks the API with one of the keys (read from the
    same file); the key never reaches a command line, the plan or the logs."""
    port = free_port()
    keys = cli.tmp / "keys"
    keys.write_text("# the frontend's keys\nsk-test-one\nsk-test-two\n")
    recipe = cli.recipe(
        mocker_recipe("keyed", port, replicas=1).replace(
            "frontend: {", f"frontend: {{api_keys_file: '{keys}', "
        )
    )
    up = cli("up", str(recipe), "--detach")
    try:
        assert up.returncode == 0, up.stderr
        base = f"http://127.0.0.1:{port}/v1"
        body = {"model": "mock-llama", "prompt": "x", "max_tokens": 2}
        stranger = httpx.post(f"{base}/completions", json=body, trust_env=False)
        assert stranger.status_code == 401
        assert stranger.json()["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": "Bearer sk-test-two"}
        known = httpx.post(f"{base}/completions", json=body, headers=headers, trust_env=False)
        assert known.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).status_code == 200
    finally:
        assert cli("down").returncode == 0
    run = cli.home / "runs" / "keyed"
    texts = [(run / "state.json").read_text(), (run / "supervisor.log").read_text()]
    texts += [log.read_text() for log in (run / "logs").glob("*.log")]
    assert not any("sk-test" in text for text in texts)
    assert any(str(keys) in text for text in texts)  # the file's name is on the plan
