"""``dynamoctl up`` over SSH: a managed etcd and the frontend on the head host, workers on
both hosts (real sshds in network namespaces); killing the supervisor with SIGKILL and
running ``down`` leaves nothing on any host."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _write_recipe(hosts: SshHosts, tmp_path: Path, port: int, name: str) -> Path:
    recipe = tmp_path / "ssh.yaml"
    recipe.write_text(f"""\
schema: 1
name: {name}
discovery: {{backend: etcd, managed: true, lease_ttl: 3}}
{hosts.target_yaml(tmp_path)}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{host: 0.0.0.0, port: {port}}}
workers:
  agg: {{engine: mocker, replicas: 2, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10}}}}
supervision: {{probe_interval: 0.3}}
""")
    return recipe


def _cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    return cli


def test_ssh_deployment_serves_and_down_cleans_after_a_killed_supervisor(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    hosts, port = ssh_hosts2, free_port()
    head = hosts.names[0]  # reached by name; components bind its address
    ours = (head, hosts.addresses[0])
    recipe = _write_recipe(hosts, tmp_path, port, "sshdep")
    cli = _cli(tmp_path)
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
            out = client.completions.create(
                model="mock-llama", prompt="hi there", max_tokens=3, extra_body={"ignore_eos": True}
            )
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


def _status(cli: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    result = cli("status", "--json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def _sshd_sessions(hosts: SshHosts) -> list[psutil.Process]:
    """The hosts' per-connection sshd processes (``sshd: USER@notty``, its monitor)."""
    found = []
    for ns in hosts.namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        for pid in map(int, pids.split()):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                line = " ".join(proc.cmdline())  # not the listener: sshd stays up
                if line.startswith("sshd: ") and "[listener]" not in line:
                    found.append(proc)
    return found


def test_ssh_supervisor_is_adopted_and_a_dropped_connection_reattached(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    hosts, port = ssh_hosts2, free_port()
    head = hosts.names[0]
    recipe = _write_recipe(hosts, tmp_path, port, "sshadopt")
    cli = _cli(tmp_path)
    client = openai.OpenAI(base_url=f"http://{head}:{port}/v1", api_key="none", timeout=30)
    up = cli("up", str(recipe), "--detach")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        pids = {row["name"]: row["pid"] for row in _status(cli)["instances"]}
        run = tmp_path / "home" / "runs" / "sshadopt"
        first = json.loads((run / "state.json").read_text())["supervisor_pid"]

        # SIGKILL the supervisor: its connections drop, every keeper is orphaned, and
        # serving goes on; `adopt` attaches to each keeper over a new SSH channel.
        os.kill(first, signal.SIGKILL)
        _until(lambda: not psutil.pid_exists(first), "the supervisor gone")
        logs = {name: run / "logs" / f"{name}.log" for name in pids}
        out = client.completions.create(
            model="mock-llama", prompt="hi there", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None and out.usage.completion_tokens == 3
        adopt = cli("adopt", "sshadopt", "--detach")
        assert adopt.returncode == 0, adopt.stdout + adopt.stderr
        report = _status(cli)
        assert {row["name"]: (row["pid"], row["state"]) for row in report["instances"]} == {
            name: (pid, "READY") for name, pid in pids.items()
        }
        assert all(row["restarts"] == 0 for row in report["instances"])
        # Output reaches the log on the supervisor's host again, through the new channel,
        # with what the keeper kept while no one was attached.
        orphaned = "supervisor gone (stdin closed): kept 60 s"
        _until(
            lambda: all(
                orphaned in p.read_text() and "lifeline attached (1 now)" in p.read_text()
                for p in logs.values()
            ),
            "the kept output in every log",
        )

        # Drop every SSH connection under the running supervisor: it reattaches, unseen.
        attached = {name: p.read_text().count("lifeline attached") for name, p in logs.items()}
        sessions = _sshd_sessions(hosts)
        assert sessions
        for proc in sessions:
            proc.kill()
        _until(
            lambda: all(
                p.read_text().count("lifeline attached") > attached[name]
                for name, p in logs.items()
            ),
            "every keeper reattached",
        )
        report = _status(cli)
        assert {row["name"]: (row["pid"], row["restarts"]) for row in report["instances"]} == {
            name: (pid, 0) for name, pid in pids.items()
        }

        # Restarts work afterwards: kill -9 the worker under agg-1's keeper.
        worker = psutil.Process(pids["agg-1"]).children()[0]
        worker.kill()
        _until(
            lambda: any(
                row["name"] == "agg-1" and row["restarts"] == 1 and row["state"] == "READY"
                for row in _status(cli)["instances"]
            ),
            "agg-1 restarted",
        )
        out = client.completions.create(
            model="mock-llama", prompt="hi again", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None and out.usage.completion_tokens == 3
        assert cli("down", "sshadopt").returncode == 0
        ours = (head, hosts.addresses[0], "sshadopt")
        _until(lambda: not _ours_on(hosts, *ours), "nothing left on the hosts", 30)
    finally:
        cli("down", "sshadopt", "--now")
