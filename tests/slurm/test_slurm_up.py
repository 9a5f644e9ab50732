"""A whole deployment under real Slurm: ``sbatch slurm/launch.sh RECIPE`` serves, every
instance is a job step, and ``scancel`` leaves nothing; ``dynamoctl up`` from a "login
node" submits and follows the job, ``status``/``drain`` work from there (saying so while
the job is queued), and ``dynamoctl down`` ends it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil

from tests.infra.slurm_cluster import SlurmCluster
from tests.slurm.conftest import wait_job_state
from tests.supervisor.conftest import REPO, free_port


def _recipe(tmp: Path, name: str, port: int, sbatch_args: str = "[]") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: embedded, path: {tmp / "discovery"}}}
target: {{kind: slurm, partition: debug, nodes: 1, gpus_per_node: 0, time_limit: "00:10:00",
         extra_sbatch_args: {sbatch_args}}}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}}}
workers:
  agg: {{engine: mocker, replicas: 2, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10}}}}
supervision: {{probe_interval: 0.3}}
""")
    return path


def _wait_serving(home: Path, name: str, log: Path, timeout: float = 120) -> dict[str, object]:
    state_file = home / "runs" / name / "state.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if state["phase"] == "serving":
                return state  # type: ignore[no-any-return]
            assert state["phase"] != "failed", state["error"]
        time.sleep(0.3)
    raise AssertionError(
        f"not serving after {timeout} s:\n{log.read_text() if log.exists() else ''}"
    )


def _leftovers(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(
                proc.info["cmdline"] or []
            ):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _steps(slurm: SlurmCluster, job: str) -> list[str]:
    return slurm.run("squeue", "--steps", f"--jobs={job}", "-h", "-o", "%j").split()


def _ask(port: int) -> int:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
    out = client.completions.create(
        model="mock-llama", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None
    return out.usage.completion_tokens


def test_sbatch_launch_sh_serves_and_scancel_ends_every_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    port = free_port()
    home = tmp_path / "home"
    recipe = _recipe(tmp_path, "slurmdep", port)
    log = tmp_path / "job.out"
    env = {**slurm.env, "DYNAMOCTL_HOME": str(home), "DYNAMOCTL_PYTHON": sys.executable}
    job = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", "slurm/launch.sh", str(recipe)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    try:
        _wait_serving(home, "slurmdep", log)
        assert _ask(port) == 3
        steps = slurm.run("squeue", "--steps", f"--jobs={job}", "-h", "-o", "%j")
        assert sorted(s for s in steps.split() if s.startswith("dynamoctl:")) == [
            "dynamoctl:agg-0", "dynamoctl:agg-1", "dynamoctl:frontend-0"
        ]  # fmt: skip
    finally:
        slurm.run("scancel", job, check=False)
    wait_job_state(slurm, job, {"", "CANCELLED", "COMPLETED", "FAILED"})
    deadline = time.monotonic() + 30
    while _leftovers(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _leftovers(str(tmp_path)) == []


def test_from_a_login_node_up_status_drain_and_down(slurm: SlurmCluster, tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    # Held, so the commands meet the job while it is queued; released below.
    recipe = _recipe(tmp_path, "submitted", port, sbatch_args="[--hold]")
    env = {k: v for k, v in slurm.env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["DYNAMOCTL_HOME"] = str(home)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "dynamoctl", *args]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)

    up = subprocess.Popen(
        [sys.executable, "-m", "dynamoctl", "up", str(recipe)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job_file = home / "runs" / "submitted" / "slurm-job"
        deadline = time.monotonic() + 60
        while not job_file.exists() and up.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        job = job_file.read_text().strip()
        assert wait_job_state(slurm, job, {"PENDING"}) == "PENDING"

        queued = cli("status", "--json")  # unnamed: the only one, though its lock is free
        assert queued.returncode == 3, queued.stderr
        report = json.loads(queued.stdout)
        assert report["phase"] == "queued" and f"job {job} is pending" in report["message"]
        refused = cli("drain", "agg-1", "--name", "submitted")
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and "pending in the queue" in refused.stderr

        slurm.run("scontrol", "release", job)
        out, err = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, out + err
    assert "submitted Slurm job" in out and "serving mock-llama" in out
    assert _ask(port) == 3

    # The control endpoint listens beyond loopback, is recorded under this host's name, and
    # still wants the token.
    state = json.loads((home / "runs" / "submitted" / "state.json").read_text())
    assert state["slurm_job"] == job
    control = httpx.URL(state["control"])
    assert control.host == socket.gethostname()
    listening = psutil.Process(state["supervisor_pid"]).net_connections(kind="tcp")
    assert [c.laddr.ip for c in listening if c.laddr.port == control.port] == ["0.0.0.0"]
    assert httpx.get(f"{control}/status", trust_env=False).status_code == 401
    forged = httpx.post(f"{control}/drain", json={"target": "agg-0"}, trust_env=False)
    assert forged.status_code == 401

    status = cli("status", "submitted", "--json")
    assert status.returncode == 0, status.stderr
    serving = json.loads(status.stdout)
    assert serving["phase"] == "serving"
    assert {i["name"]: i["state"] for i in serving["instances"]} == {
        "agg-0": "READY", "agg-1": "READY", "frontend-0": "READY"
    }  # fmt: skip

    drained = cli("drain", "agg-1", "--name", "submitted")
    assert drained.returncode == 0, drained.stderr
    assert "stopped agg-1" in drained.stdout
    after = json.loads(cli("status", "submitted", "--json").stdout)
    rows = {i["name"]: i for i in after["instances"]}
    assert {name: row["state"] for name, row in rows.items()} == {
        "agg-0": "READY", "agg-1": "STOPPED", "frontend-0": "READY"
    }  # fmt: skip
    assert rows["agg-1"]["restarts"] == 0  # a drain spends no restart budget
    deadline = time.monotonic() + 10
    while "dynamoctl:agg-1" in (steps := _steps(slurm, job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "dynamoctl:agg-1" not in steps and "dynamoctl:agg-0" in steps
    assert _ask(port) == 3

    down = cli("down", "submitted")
    assert down.returncode == 0, down.stderr
    assert "ended" in down.stdout
    deadline = time.monotonic() + 30
    while _leftovers(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _leftovers(str(tmp_path)) == []
    state = json.loads((home / "runs" / "submitted" / "state.json").read_text())
    assert state["phase"] == "stopped"  # the supervisor drained and stopped, not killed
    gone = cli("status", "submitted")
    assert gone.returncode == 3 and "not running" in gone.stdout
