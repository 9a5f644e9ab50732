"""The multi-node Slurm cluster itself (fixture ``slurm_multinode``): three compute nodes
and a login host, each a network + UTS namespace known by name; jobs are submitted from the
login host, span the nodes, find each other by name and get fake GPUs."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.infra.slurm_cluster import FAKE_GPUS, NODE_CPUS, MultiNodeCluster

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(60)]

PY = sys.executable
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _on_login(cluster: MultiNodeCluster, *argv: str, timeout: float = 20) -> str:
    """``argv`` on the login host; its stdout (fails on a non-zero exit)."""
    return cluster.run(*argv, on_login=True, timeout=timeout)


def _job_state(cluster: MultiNodeCluster, job: str) -> str:
    shown = cluster.run("scontrol", "show", "job", "-o", job, check=False)
    found = re.search(r"\bJobState=(\S+)", shown)
    return found.group(1) if found else "?"


def _wait_state(cluster: MultiNodeCluster, job: str, states: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = _job_state(cluster, job)
    while state not in states and time.monotonic() < deadline:
        time.sleep(0.1)
        state = _job_state(cluster, job)
    return state


def _batch(cluster: MultiNodeCluster, tmp_path: Path, script: str, *sbatch: str) -> str:
    """Submit ``script`` from the login host, wait (bounded) for it to end; its output."""
    path, out = tmp_path / "job.sh", tmp_path / "job.out"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    job = _on_login(
        cluster, "sbatch", "--parsable", "--time=2:00", f"--output={out}", *sbatch, str(path)
    ).strip()
    state = _wait_state(cluster, job, ENDED, timeout=25)
    if state not in ENDED:
        cluster.run("scancel", job, check=False)
    text = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", f"job {job} is {state}:\n{text}\n{cluster.log_tails()}"
    return text


def _settled(cluster: MultiNodeCluster, timeout: float = 30) -> list[str]:
    """``sinfo``'s node rows once none is still completing a job: the cluster is shared, and
    an earlier test's last job may still be ending on its nodes."""
    deadline = time.monotonic() + timeout
    while True:
        rows = cluster.run("sinfo", "-h", "-N", "-o", "%N|%T|%G|%c|%P").split()
        if not any("|completing" in row for row in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_three_named_nodes_idle_with_fake_gpus(slurm_multinode: MultiNodeCluster) -> None:
    cluster = slurm_multinode
    assert len(cluster.nodes) == 3 and len(set(cluster.nodes)) == 3
    rows = _settled(cluster)
    assert sorted(rows) == [
        f"{node}|idle|gpu:{FAKE_GPUS}|{NODE_CPUS}|{cluster.partition}*" for node in cluster.nodes
    ]
    addresses = list(cluster.addresses.values())
    assert list(cluster.addresses) == cluster.nodes and len(set(addresses)) == 3
    for node, address in cluster.addresses.items():
        assert not ipaddress.ip_address(address).is_loopback
        assert socket.gethostbyname(node) == address  # here, as on every host: /etc/hosts
        shown = cluster.run("scontrol", "show", "node", "-o", node)
        # Known by name only: slurm.conf gives no NodeAddr, Slurm resolves the name.
        assert f"NodeAddr={node} " in shown and f"NodeHostName={node} " in shown
    ping = cluster.run("scontrol", "ping")
    assert f"at {cluster.controller.name} is UP" in ping
    assert cluster.controller.name not in cluster.nodes


def test_login_host_is_no_node_and_clients_work_there(slurm_multinode: MultiNodeCluster) -> None:
    cluster, login = slurm_multinode, slurm_multinode.login_host
    assert _on_login(cluster, "hostname").strip() == login.name
    probe = "import socket; print(socket.gethostbyname(socket.gethostname()))"
    assert _on_login(cluster, PY, "-c", probe).strip() == login.address
    assert not ipaddress.ip_address(login.address).is_loopback
    listed = _on_login(cluster, "sinfo", "-h", "-N", "-o", "%N %T").split("\n")
    assert sorted(line for line in listed if line) == [f"{node} idle" for node in cluster.nodes]
    assert login.name not in cluster.nodes
    done = subprocess.run(
        cluster.login(["scontrol", "show", "node", login.name]),
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode != 0 and f"Node {login.name} not found" in done.stdout + done.stderr
    assert login.name not in cluster.conf.read_text()


def test_batch_job_from_login_spans_the_three_nodes(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster = slurm_multinode
    whoami = "import socket; n = socket.gethostname(); print('step', n, socket.gethostbyname(n))"
    out = _batch(
        cluster,
        tmp_path,
        f"""\
        echo "batch $(hostname) submit=$SLURM_SUBMIT_HOST nodes=$SLURM_JOB_NODELIST"
        srun {PY} -c "{whoami}"
        """,
        "--nodes=3",
    )
    lines = out.splitlines()
    batch = next(line for line in lines if line.startswith("batch "))
    _, host, submit, nodelist = batch.split()
    assert host == cluster.nodes[0]  # the batch script runs on the first node
    assert submit == f"submit={cluster.login_host.name}"
    compressed = nodelist.removeprefix("nodes=")
    assert compressed != ",".join(cluster.nodes)  # a hostlist expression: dynTAG-node[1-3]
    assert cluster.run("scontrol", "show", "hostnames", compressed).split() == cluster.nodes
    # Each step ran on its node, under the node's hostname, which resolves to its address.
    steps = sorted(line.split()[1:] for line in lines if line.startswith("step "))
    assert steps == [[node, cluster.addresses[node]] for node in cluster.nodes]


SERVER = """\
import socket
srv = socket.create_server(("0.0.0.0", {port}))
srv.settimeout(20)
conn, peer = srv.accept()
got = conn.recv(200).decode()
conn.sendall(f"{{socket.gethostname()}} got {{got}} from {{peer[0]}}".encode())
conn.close()
"""

CLIENT = """\
import json, socket, sys, time
target = sys.argv[1]
deadline = time.monotonic() + 15
while True:
    try:
        conn = socket.create_connection((target, {port}), timeout=2)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
conn.sendall(socket.gethostname().encode())
reply = conn.recv(200).decode()
print(json.dumps({{"resolved": socket.gethostbyname(target), "reply": reply}}), flush=True)
"""


def test_steps_on_two_nodes_connect_by_name(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster = slurm_multinode
    _, server_node, client_node = cluster.nodes
    port = 23456  # each node has its own network: free on a fresh namespace
    (tmp_path / "server.py").write_text(SERVER.format(port=port))
    (tmp_path / "client.py").write_text(CLIENT.format(port=port))
    step = "srun --nodes=1 --ntasks=1 --overlap"
    out = _batch(
        cluster,
        tmp_path,
        f"""\
        {step} -w {server_node} {PY} {tmp_path / "server.py"} &
        {step} -w {client_node} {PY} {tmp_path / "client.py"} {server_node}
        wait
        """,
        "--nodes=3",
    )
    result = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert result["resolved"] == cluster.addresses[server_node]
    # The server saw the client's own address: hosts talk directly over the bridge.
    assert (
        result["reply"] == f"{server_node} got {client_node} from {cluster.addresses[client_node]}"
    )


def test_gres_sets_cuda_visible_devices_and_steers_placement(
    slurm_multinode: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster = slurm_multinode
    show = 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"'
    every = _on_login(
        cluster, "srun", "--nodes=3", f"--gpus-per-node={FAKE_GPUS}", "sh", "-c", show
    )
    assert sorted(every.splitlines()) == [f"{node} 0,1" for node in cluster.nodes]

    first = cluster.nodes[0]
    out = tmp_path / "holder.out"
    holder = _on_login(
        cluster, "sbatch", "--parsable", "--time=2:00", f"--output={out}", f"--nodelist={first}",
        "--gres=gpu:1", "--wrap", 'echo "cvd=$CUDA_VISIBLE_DEVICES"; exec sleep 60',
    ).strip()  # fmt: skip
    try:
        assert _wait_state(cluster, holder, {"RUNNING"}, timeout=15) == "RUNNING"
        deadline = time.monotonic() + 10
        while "cvd=" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, "the holder job printed nothing"
            time.sleep(0.05)
        assert out.read_text().strip() == "cvd=0"
        # The other GPU of the first node is the one left.
        left = ["srun", f"--nodelist={first}", "--gres=gpu:1", "printenv", "CUDA_VISIBLE_DEVICES"]
        assert _on_login(cluster, *left).strip() == "1"
        # Two GPUs on one node: not the first any more.
        pair = _on_login(cluster, "srun", "--nodes=1", "--gres=gpu:2", "sh", "-c", show).split()
        assert pair[0] in cluster.nodes[1:] and pair[1] == "0,1"
    finally:
        cluster.run("scancel", holder, check=False)
        _wait_state(cluster, holder, ENDED, timeout=15)


def test_a_node_is_a_host_of_its_own_outside_slurm(slurm_multinode: MultiNodeCluster) -> None:
    """A node's namespace has its own hostname and only its own address (and loopback)."""
    cluster = slurm_multinode
    node = cluster.nodes[1]
    done = subprocess.run(
        cluster.on_node(node, ["sh", "-c", "hostname; ip -4 -o addr show"]),
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    name, *addrs = done.stdout.splitlines()
    assert name == node
    found = sorted(re.search(r"inet (\S+)/", line).group(1) for line in addrs)  # type: ignore[union-attr]
    assert found == sorted(["127.0.0.1", cluster.addresses[node]])
