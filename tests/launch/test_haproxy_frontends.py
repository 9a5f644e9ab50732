"""Frontends on two hosts (``frontend.hosts: 2``, real sshds in network namespaces) behind a
real HAProxy configured by ``dynamoctl lb-config``: both frontends serve through it, and
draining one under a bounded load fails no request."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.infra.ssh_hosts import SshHosts, tree_python
from tests.launch.test_ssh_up import _cli, _status, _until
from tests.supervisor.conftest import completions_until, free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _recipe(hosts: SshHosts, tmp_path: Path, port: int) -> Path:
    recipe = tmp_path / "lb.yaml"
    recipe.write_text(f"""\
schema: 1
name: lbdep
discovery: {{backend: etcd, managed: true, lease_ttl: 3}}
{hosts.target_yaml(tmp_path, tree_python(tmp_path))}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend: {{host: 0.0.0.0, port: {port}, hosts: 2, processes: 1}}
workers:
  agg: {{engine: mocker, replicas: 2, gpus_per_replica: 0,
         engine_args: {{num-gpu-blocks: 512, speedup-ratio: 10}}}}
supervision: {{probe_interval: 0.3, drain_timeout: 20}}
""")
    return recipe


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:  # HAProxy not listening yet
        return False


def _served_by(stats_url: str) -> dict[str, int]:
    """Sessions each backend server has had (HAProxy's CSV statistics, ``stot``)."""
    lines = httpx.get(stats_url, timeout=5).text.splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
    return {
        r["svname"]: int(r["stot"])
        for r in rows
        if r["pxname"] == "dynamoctl_frontends" and r["svname"] not in ("BACKEND", "FRONTEND")
    }


@pytest.mark.timeout(400)
def test_haproxy_balances_frontends_on_two_hosts_and_a_drain_fails_nothing(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    hosts, port, lb_port, stats_port = ssh_hosts2, free_port(), free_port(), free_port()
    recipe = _recipe(hosts, tmp_path, port)
    cli = _cli(tmp_path)
    config = cli("lb-config", str(recipe), "--bind", f"127.0.0.1:{lb_port}")
    assert config.returncode == 0, config.stderr
    for address in hosts.addresses:
        assert f" {address}:{port} check" in config.stdout
    stats = f"\nlisten stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    stats uri /\n"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(config.stdout + stats)
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    up = cli("up", str(recipe), "--detach")
    haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        placed = {r["name"]: r["host"] for r in _status(cli)["instances"]}
        assert (placed["frontend-0"], placed["frontend-1"]) == (hosts.names[0], hosts.names[1])
        base = f"http://127.0.0.1:{lb_port}/v1"
        stats_url = f"http://127.0.0.1:{stats_port}/;csv"
        _until(lambda: _healthy(f"http://127.0.0.1:{lb_port}/health"),
               "HAProxy listens and sees a healthy frontend", timeout=30)  # fmt: skip

        # Both frontends serve through HAProxy (leastconn over 3 concurrent clients).
        stop, errors, done = threading.Event(), [], []
        load = [
            threading.Thread(
                target=completions_until, args=(base, stop, errors, done), kwargs={"most": 30}
            )
            for _ in range(3)
        ]
        for thread in load:
            thread.start()
        for thread in load:
            thread.join(120)
        assert errors == [] and len(done) >= 30
        served = _served_by(stats_url)
        assert len(served) == 2 and all(served.values()), served

        # Drain frontend-1 under load: no request fails; frontend-1 ends STOPPED.
        stop, errors, done = threading.Event(), [], []
        load = [
            threading.Thread(
                target=completions_until, args=(base, stop, errors, done), kwargs={"most": 400}
            )
            for _ in range(3)
        ]
        for thread in load:
            thread.start()
        try:
            time.sleep(1.0)
            drained = cli("drain", "frontend-1")
            assert drained.returncode == 0, drained.stderr
            time.sleep(2.0)  # load goes on once frontend-1 is gone
        finally:
            stop.set()
            for thread in load:
                thread.join(120)
        assert errors == [], errors[:3]
        assert len(done) > 10
        states = {r["name"]: r["state"] for r in _status(cli)["instances"]}
        assert states["frontend-1"] == "STOPPED" and states["frontend-0"] == "READY"
    finally:
        haproxy.terminate()
        haproxy.wait(10)
        cli("down", "lbdep", "--now")
