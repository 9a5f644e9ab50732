"""A whole deployment under real Slurm: ``sbatch slurm/launch.sh RECIPE`` serves, every
instance is a job step, and ``scancel`` leaves nothing; ``dynamoctl up`` from a "login
node" submits and follows the job, and ``dynamoctl down`` ends it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil

from tests.infra.slurm_cluster import SlurmCluster
from tests.slurm.conftest import wait_job_state
from tests.supervisor.conftest import REPO, free_port


def _recipe(tmp: Path, name: str, port: int) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: embedded, path: {tmp / "discovery"}}}
target: {{kind: slurm, partition: debug, nodes: 1, gpus_per_node: 0, time_limit: "00:10:00"}}
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


def _ask(port: int) -> int:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
    out = client.completions.create(model="mock-llama", prompt="hello", max_tokens=3)
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


def test_up_from_a_login_node_submits_and_down_cancels(slurm: SlurmCluster, tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    recipe = _recipe(tmp_path, "submitted", port)
    env = {**slurm.env, "DYNAMOCTL_HOME": str(home)}
    env.pop("SLURM_JOB_ID", None)
    env.pop("SLURM_JOB_NODELIST", None)
    up = subprocess.run(
        [sys.executable, "-m", "dynamoctl", "up", str(recipe)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert "submitted Slurm job" in up.stdout and "serving mock-llama" in up.stdout
    assert _ask(port) == 3
    down = subprocess.run(
        [sys.executable, "-m", "dynamoctl", "down", "submitted"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert down.returncode == 0, down.stderr
    assert "ended" in down.stdout
    deadline = time.monotonic() + 30
    while _leftovers(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _leftovers(str(tmp_path)) == []
    state = json.loads((home / "runs" / "submitted" / "state.json").read_text())
    assert state["phase"] == "stopped"  # the supervisor drained and stopped, not killed
