"""Tests' ports (tests/infra/ports.py): outside the kernel's ephemeral range, one slice per
xdist worker, free when handed out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.infra.ports import ephemeral_range, free_port, free_ports

REPO = Path(__file__).resolve().parents[1]


def slice_of(worker: str) -> list[int]:
    """Ports a fresh process of xdist worker ``worker`` hands out (ten of them)."""
    code = "import json, tests.infra.ports as p; print(json.dumps(p.free_ports(10)))"
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    ports: list[int] = json.loads(out.stdout)
    return ports


def test_ports_are_outside_the_ephemeral_range_and_distinct() -> None:
    low, high = ephemeral_range()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(not low <= port <= high for port in ports), (low, high, ports)


def test_a_port_is_not_handed_out_while_something_holds_it() -> None:
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        assert port not in free_ports(999)  # a whole slice's round: skipped, taken


def test_two_xdist_workers_take_from_different_slices() -> None:
    first, second = slice_of("gw1"), slice_of("gw2")
    assert max(first) < min(second) or max(second) < min(first)
    low, high = ephemeral_range()
    assert all(not low <= port <= high for port in first + second)
