"""The planner on an SSH target (real sshds in network namespaces, hosts addressed by
name): it runs on the head host, reaches the supervisor's control endpoint, the workers'
load streams and the frontend across hosts, scales the pool onto the second host under a
load step and drains it back when the load drops, with no client request failing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.ssh_hosts import SshHosts
from tests.launch.test_ssh_up import _cli, _status, _until
from tests.planner.load import StepLoad
from tests.supervisor.conftest import free_port

pytestmark = pytest.mark.planner


def _write_recipe(hosts: SshHosts, tmp_path: Path, port: int) -> Path:
    # The local planner test's load (tests/planner/test_planner_up.py): 12 clients of
    # 1000-word prompts need more than one replica to meet 150 ms; one client does not.
    recipe = tmp_path / "ssh-planner.yaml"
    recipe.write_text(f"""\
schema: 1
name: sshplan
discovery: {{backend: etcd, managed: true, lease_ttl: 3}}
{hosts.target_yaml(tmp_path)}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{host: 0.0.0.0, port: {port}, queue_timeout: 60.0, router: {{busy_kv_usage: null}}}}
workers:
  agg: {{engine: mocker, replicas: 1, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 8192, speedup-ratio: 1}}}}
supervision: {{probe_interval: 0.3, backoff_base: 0.2, drain_timeout: 30}}
planner:
  mode: load
  ttft_target_ms: 150.0
  itl_target_ms: 1000.0
  agg_max_replicas: 2
  gpu_budget: 2
  load_interval: 0.5
  cooldown: 1.5
  stable_intervals: 2
""")
    return recipe


def _agg(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {r["name"]: (r["host"], r["state"]) for r in report["instances"] if r["pool"] == "agg"}


def test_the_planner_scales_across_ssh_hosts_and_drains_back(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    hosts, port = ssh_hosts2, free_port()
    head, second = hosts.names
    cli = _cli(tmp_path)
    up = cli("up", str(_write_recipe(hosts, tmp_path, port)), "--detach")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        placed = {r["name"]: r["host"] for r in _status(cli)["instances"]}
        assert placed["planner-0"] == head and placed["agg-0"] == head, placed
        _until(lambda: (_status(cli).get("planner") or {}).get("phase") == "planning", "planning")

        with StepLoad(f"http://{head}:{port}/v1") as load:
            _until(lambda: _agg(_status(cli)).get("agg-1") == (second, "READY"), "agg-1 on the "
                   "second host", timeout=60)  # fmt: skip
            load.drop()
            _until(lambda: _agg(_status(cli)).get("agg-1", ("", ""))[1] == "STOPPED",
                   "agg-1 drained", timeout=90)  # fmt: skip
        assert load.errors == [], load.errors[:3]
        assert len(load.done) > 20
        report = _status(cli)
        assert _agg(report)["agg-0"] == (head, "READY")
        planner = report["planner"]
        assert planner["last_change"].endswith("-> 1"), planner
        log = (tmp_path / "home" / "runs" / "sshplan" / "logs" / "planner-0.log").read_text()
        assert "load loop: agg 1 -> 2" in log and "draining agg-1" in log, log[-2000:]
        print(json.dumps(planner, indent=1))
    finally:
        down = cli("down", "sshplan")
        assert down.returncode == 0, down.stderr
