"""``dynamoctl up`` over SSH: a managed etcd and the frontend on the head host, workers on
both hosts (real sshds in network namespaces); killing the supervisor with SIGKILL and
running ``down`` leaves nothing on any host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil

from tests.infra.ssh_hosts import SshHosts
from tests.supervisor.conftest import REPO, free_port


def _ours_on(hosts: SshHosts, *markers: str) -> list[int]:
    """Live processes in the hosts' namespaces whose command line mentions a marker."""
    found = []
    for ns in hosts.namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        for pid in map(int, pids.split()):
            try:
                proc = psutil.Process(pid)
                line = " ".join(proc.cmdline())
                if proc.status() != psutil.STATUS_ZOMBIE and any(m in line for m in markers):
                    found.append(pid)
            except psutil.Error:
                continue
    return found


def test_ssh_deployment_serves_and_down_cleans_after_a_killed_supervisor(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    hosts, port = ssh_hosts2, free_port()
    head = hosts.names[0]  # reached by name; components bind its address
    ours = (head, hosts.addresses[0])
    recipe = tmp_path / "ssh.yaml"
    recipe.write_text(f"""\
schema: 1
name: sshdep
discovery: {{backend: etcd, managed: true, lease_ttl: 3}}
target:
  kind: ssh
  hosts: [{", ".join(hosts.names)}]
  user: {hosts.user}
  port: {hosts.port}
  key: {hosts.key}
  known_hosts: {hosts.known_hosts}
  python: {sys.executable}
  workdir: {tmp_path}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{host: 0.0.0.0, port: {port}}}
workers:
  agg: {{engine: mocker, replicas: 2, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10}}}}
supervision: {{probe_interval: 0.3}}
""")
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    up = cli("up", str(recipe), "--detach")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"http://{head}:{port}/v1" in up.stdout
        report = json.loads(cli("status", "--json").stdout)
        placed = {row["name"]: (row["host"], row["state"]) for row in report["instances"]}
        assert placed == {
            "etcd-0": (head, "READY"),
            "agg-0": (hosts.names[0], "READY"),
            "agg-1": (hosts.names[1], "READY"),
            "frontend-0": (head, "READY"),
        }
        client = openai.OpenAI(base_url=f"http://{head}:{port}/v1", api_key="none", timeout=30)
        for _ in range(4):  # both workers get some
            out = client.completions.create(model="mock-llama", prompt="hi there", max_tokens=3)
            assert out.usage is not None and out.usage.completion_tokens == 3
        assert len(_ours_on(hosts, *ours)) >= 4  # etcd, 2 workers, frontend (+ keepers)

        state = json.loads((tmp_path / "home" / "runs" / "sshdep" / "state.json").read_text())
        os.kill(state["supervisor_pid"], signal.SIGKILL)
        down = cli("down", "sshdep")
        assert down.returncode == 0, down.stderr
        assert "supervisor gone" in down.stdout
        deadline = time.monotonic() + 30
        while _ours_on(hosts, *ours) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert _ours_on(hosts, *ours) == []
    finally:
        cli("down", "sshdep", "--now")
