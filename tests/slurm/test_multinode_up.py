"""The flagship shape on a real multi-node Slurm cluster, addressed by name.

The topology of ``recipes/llama70b-disagg.yaml``, with the mocker standing in for vLLM: a
managed etcd on the head node, prefill and decode pools on different nodes (GPU replicas
placed by GRES), a standalone router replica, the frontend reachable from the login host.
Run both ways an operator would: ``sbatch slurm/launch.sh RECIPE`` from the login host,
and ``dynamoctl up RECIPE`` there. Every client command runs on the login host, which is
not a compute node; nothing is reached by 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.infra.slurm_cluster import MultiNodeCluster
from tests.slurm.conftest import wait_job_state
from tests.supervisor.conftest import REPO

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(300)]

# A prompt long enough to be prefilled remotely (min_remote_prefill_tokens below).
PROMPT = " ".join(f"word{i}" for i in range(120))


def _recipe(tmp: Path, name: str, cluster: MultiNodeCluster, port: int) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: etcd, managed: true, lease_ttl: 4}}
target: {{kind: slurm, partition: {cluster.partition}, nodes: 3, gpus_per_node: 2,
         time_limit: "00:20:00"}}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend:
  port: {port}
  router: {{mode: kv, replicas: 1, min_remote_prefill_tokens: 32}}
workers:
  prefill: {{engine: mocker, replicas: 1, gpus_per_replica: 2,
            engine_args: {{num-gpu-blocks: 512, speedup-ratio: 20}}}}
  decode: {{engine: mocker, replicas: 1, gpus_per_replica: 2,
           engine_args: {{num-gpu-blocks: 512, speedup-ratio: 20}}}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, drain_timeout: 10}}
""")
    return path


# A client on the login host: 16-token completions until the stop file appears (bounded in
# time), each prompt its own (no shared prefix pins the KV router to one worker); prints
# how many succeeded and each failure.
CLIENT_LOAD = """\
import json, os, random, sys, time, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0, timeout=60)
done, errors, deadline = 0, [], time.monotonic() + float(sys.argv[3])
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    prompt = " ".join(f"w{random.randrange(10**6)}" for _ in range(24))
    try:
        out = client.completions.create(model="mock-llama", prompt=prompt, max_tokens=16,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 16
        done += 1
    except Exception as exc:
        errors.append(repr(exc))
print(json.dumps({"done": done, "errors": errors}))
"""


class Login:
    """Commands run on the login host, as its user would run them."""

    def __init__(self, cluster: MultiNodeCluster, home: Path) -> None:
        self.cluster = cluster
        self.env = {**cluster.env, "DYNAMOCTL_HOME": str(home), "DYNAMOCTL_PYTHON": sys.executable}

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cluster.login(argv),
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "dynamoctl", *args, timeout=timeout)

    def start_load(self, endpoint: str, stop_file: Path, seconds: float) -> subprocess.Popen[str]:
        """:data:`CLIENT_LOAD` in the background; it ends when ``stop_file`` appears."""
        argv = [sys.executable, "-c", CLIENT_LOAD, endpoint, str(stop_file), str(seconds)]
        return subprocess.Popen(
            self.cluster.login(argv), env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def status(self, name: str) -> dict[str, Any]:
        done = self.cli("status", name, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def get(self, url: str) -> str:
        code = "import sys, httpx; print(httpx.get(sys.argv[1], trust_env=False).text)"
        done = self.run(sys.executable, "-c", code, url, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def complete(self, endpoint: str, prompt: str = PROMPT) -> dict[str, Any]:
        code = (
            "import json, sys, openai\n"
            "c = openai.OpenAI(base_url=sys.argv[1], api_key='none', timeout=60)\n"
            "r = c.completions.create(model='mock-llama', prompt=sys.argv[2], max_tokens=4,\n"
            "                        extra_body={'ignore_eos': True})\n"
            "print(json.dumps(r.model_dump()))\n"
        )
        done = self.run(sys.executable, "-c", code, endpoint, prompt, timeout=90)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]


def _state(home: Path, name: str) -> dict[str, Any] | None:
    path = home / "runs" / name / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def _wait_serving(home: Path, name: str, log: Path, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(home, name)
        if state is not None and state["phase"] == "serving":
            return state
        assert state is None or state["phase"] != "failed", state["error"]
        time.sleep(0.3)
    raise AssertionError(f"not serving after {timeout} s:\n{_tail(log)}")


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no output)"
    return "\n".join(text.splitlines()[-lines:])


def _processes(name: str) -> list[psutil.Process]:
    """Live processes of deployment ``name`` (its namespace, recipe or run directory)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and re.search(
                rf"(--namespace {name}\b|/{name}\.yaml|runs/{name}/)", line
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _worker(name: str, label: str) -> psutil.Process:
    """The worker process itself (not its keeper, nor the srun that started it)."""
    (proc,) = [
        p
        for p in _processes(name)
        if p.cmdline()[1:4] == ["-m", "dynamoctl", "worker"]
        and f"--label {label} " in " ".join(p.cmdline())
    ]
    return proc


def _netns(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()


def _wait_gone(name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _processes(name) and time.monotonic() < deadline:
        time.sleep(0.3)
    left = [" ".join(p.cmdline())[:200] for p in _processes(name)]
    assert left == [], left


def _remote_prefills(login: Login, endpoint: str) -> float:
    text = login.get(endpoint.removesuffix("/v1") + "/metrics")
    found = re.findall(r"^dynamoctl_frontend_remote_prefills_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(map(float, found))


def _check_placement(state: dict[str, Any], cluster: MultiNodeCluster) -> dict[str, str]:
    hosts = {spec["name"]: spec["host"] for spec in state["plan"]["instances"]}
    head = cluster.nodes[0]
    assert hosts["etcd-0"] == hosts["frontend-0"] == hosts["router-0"] == head
    assert hosts["prefill-0"] != hosts["decode-0"], hosts  # KV moves between nodes
    assert set(hosts.values()) <= set(cluster.nodes)
    for spec in state["plan"]["instances"]:  # every component bound its node's address
        assert spec["address"] == cluster.addresses[spec["host"]], spec
    assert state["plan"]["endpoint"] == f"http://{head}:{state['plan']['endpoint'].split(':')[2]}"
    return hosts


def test_sbatch_launch_sh_serves_across_nodes(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster, name = slurm_multinode, "flagsb"
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, name, cluster, 8000)
    out = tmp_path / "job.out"
    started = time.monotonic()
    sbatch = login.run(
        "sbatch", "--parsable", "--nodes=3", "--gpus-per-node=2",
        f"--partition={cluster.partition}", f"--output={out}", "slurm/launch.sh", str(recipe),
    )  # fmt: skip
    assert sbatch.returncode == 0, sbatch.stderr
    job = sbatch.stdout.strip()
    try:
        state = _wait_serving(home, name, out)
        endpoint = state["plan"]["endpoint"]
        first = login.complete(endpoint)
        print(f"\nsbatch -> first token: {time.monotonic() - started:.1f} s")
        assert first["usage"]["completion_tokens"] == 4
        hosts = _check_placement(state, cluster)
        assert _remote_prefills(login, endpoint) >= 1  # prefilled on one node, decoded on another

        # A SIGKILLed worker on a compute node is restarted there.
        victim = _worker(name, "decode-0")
        node_ns = _netns(victim.pid)
        victim.kill()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = {i["name"]: i for i in login.status(name)["instances"]}
            if rows["decode-0"]["restarts"] == 1 and rows["decode-0"]["state"] == "READY":
                break
            time.sleep(0.5)
        assert rows["decode-0"]["restarts"] == 1 and rows["decode-0"]["state"] == "READY", rows
        assert rows["decode-0"]["host"] == hosts["decode-0"]
        assert _netns(_worker(name, "decode-0").pid) == node_ns
        assert login.complete(endpoint)["usage"]["completion_tokens"] == 4
        # The supervisor's log is where `logs supervisor` finds it, though the job's
        # output went elsewhere.
        supervisor = login.cli("logs", "supervisor", "--name", name, "--tail", "200")
        assert "decode-0 failed" in supervisor.stdout, supervisor.stdout
        assert f"logs: supervisor {home / 'runs' / name / 'supervisor.log'}" in _tail(out, 400)
    finally:
        login.run("scancel", job)
    wait_job_state(cluster, job, {"", "CANCELLED", "COMPLETED", "FAILED"})
    _wait_gone(name)


def test_up_status_scale_drain_logs_down_from_the_login_host(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster, name = slurm_multinode, "flagup"
    home = tmp_path / "home"
    login = Login(cluster, home)
    recipe = _recipe(tmp_path, name, cluster, 8001)
    started = time.monotonic()
    up = login.cli("up", str(recipe), timeout=240)
    assert up.returncode == 0, (
        up.stdout + up.stderr + _tail(home / "runs" / name / "supervisor.log")
    )
    endpoint = f"http://{cluster.nodes[0]}:8001/v1"
    assert f"serving mock-llama at {endpoint}" in up.stdout
    try:
        login.complete(endpoint)
        print(f"\nup on the login host -> first token: {time.monotonic() - started:.1f} s")
        state = _state(home, name)
        assert state is not None
        hosts = _check_placement(state, cluster)
        report = login.status(name)
        assert {i["name"]: i["state"] for i in report["instances"]} == {
            n: "READY" for n in ("etcd-0", "prefill-0", "decode-0", "router-0", "frontend-0")
        }
        assert _remote_prefills(login, endpoint) >= 1

        # scale up onto the free node, drain, and scale up again (its GPUs came back).
        free = (set(cluster.nodes) - set(hosts.values())).pop()
        for _ in range(2):
            scaled = login.cli("scale", "decode=2", "--name", name)
            assert scaled.returncode == 0, scaled.stderr
            assert "decode=2: starting decode-1" in scaled.stdout
            assert f"decode-1: READY on {free}" in scaled.stdout  # waited until READY
            down_one = login.cli("scale", "decode=1", "--name", name)
            assert down_one.returncode == 0, down_one.stderr
            assert "decode=1: draining decode-1" in down_one.stdout
            assert f"decode-1: STOPPED on {free}" in down_one.stdout
            rows = {i["name"]: i for i in login.status(name)["instances"]}
            assert rows["decode-1"]["state"] == "STOPPED" and rows["decode-1"]["restarts"] == 0
            # A stopped instance shows no stale figures.
            assert rows["decode-1"]["inflight"] is None and rows["decode-1"]["kv_usage"] is None
        assert login.complete(endpoint)["usage"]["completion_tokens"] == 4

        pool = login.cli("logs", "decode", "--name", name, "--tail", "5")  # scaled ones too
        assert pool.returncode == 0 and "[decode-1] " in pool.stdout, pool.stdout
        logs = login.cli("logs", "decode-0", "--name", name, "--tail", "50")
        assert logs.returncode == 0 and "decode-0" in logs.stdout, logs.stderr
    finally:
        down = login.cli("down", name, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    _wait_gone(name)
    state = _state(home, name)
    assert state is not None and state["phase"] == "stopped"  # drained and stopped, not killed


def test_a_job_of_the_wrong_shape_or_a_busy_port_fails_before_anything_starts(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    """Three jobs at once: too few nodes, no GPUs asked for, the frontend's port taken on
    the head node. Each fails in preflight, naming what to change; no instance started."""
    cluster = slurm_multinode
    home = tmp_path / "home"
    login = Login(cluster, home)
    head = cluster.nodes[0]
    cases = {
        "shortjob": (["--nodes=1", "--gpus-per-node=2"], "target.nodes: the recipe needs 3 node"),
        "nogpus": (["--nodes=3"], "has 0 GPU(s) for this deployment"),
        "busyport": (["--nodes=3", "--gpus-per-node=2"], f"port 8009 (http) on {head} is already"),
    }
    holder = subprocess.Popen(  # something else listens on the head node's port 8009
        cluster.on_node(head, [sys.executable, "-m", "http.server", "8009"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = {}
    try:
        for name, (shape, _) in cases.items():
            recipe = _recipe(tmp_path, name, cluster, 8009 if name == "busyport" else 8010)
            done = login.run(
                "sbatch", "--parsable", *shape, f"--partition={cluster.partition}",
                f"--output={tmp_path / name}.out", "slurm/launch.sh", str(recipe),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            jobs[name] = done.stdout.strip()
        for name, (_, expected) in cases.items():
            wait_job_state(cluster, jobs[name], {"", "FAILED", "COMPLETED"}, timeout=90)
            text = _tail(tmp_path / f"{name}.out")
            assert expected in text, text
            assert "sbatch --nodes=3 --gpus-per-node=2" in text or name != "shortjob", text
            assert not (home / "runs" / name / "logs" / "frontend-0.log").exists()
            assert _processes(name) == []
    finally:
        for job in jobs.values():
            login.run("scancel", job)
        holder.kill()
        holder.wait()
