"""Ports for the servers tests start, outside the kernel's ephemeral range.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from
``/proc/sys/net/ipv4/ip_local_port_range``, the range every ephemeral bind and outgoing
connection of every process draws from too. Closed and handed to a server seconds later,
it may be taken meanwhile: a CI run's frontend found its port held by a worker's own
ephemeral bind (``[Errno 98] Address already in use``). So tests take ports below that
range (above it where there is no room below), each pytest-xdist worker from a slice of
its own (``PYTEST_XDIST_WORKER``), so that two workers never pick the same; within its
slice a process goes round from a random start, and a port is handed out only when a
bind on it succeeds now (nothing listens there, nothing is connected from it).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Sequence
from pathlib import Path

LOWEST = 10_000
"""Below this, ports are the well-known services' and commonly configured servers'."""
SLICE = 1_000
"""Ports per xdist worker (22 workers fit below the default ephemeral range)."""
DEFAULT_EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):  # not Linux: its usual default
        return DEFAULT_EPHEMERAL


def _worker_index() -> int:
    """This xdist worker's number (``gw3``: 3); 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _pool() -> range:
    """The ports outside the ephemeral range this process takes from."""
    low, high = ephemeral_range()
    if low - LOWEST >= SLICE:
        start, end = LOWEST, low
    else:  # a range reaching down to LOWEST: above it instead
        start, end = high + 1, 65536
    slices = max(1, (end - start) // SLICE)
    first = start + (_worker_index() % slices) * SLICE
    return range(first, min(first + SLICE, end))


_POOL = _pool()
_next = random.randrange(len(_POOL))  # several processes per slice (a rerun) start apart


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a bind on ``host:port`` succeeds now (without ``SO_REUSEADDR``: a port
    in TIME_WAIT is not handed out either)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range, from this worker's slice;
    not handed out again by this process until the slice has gone round."""
    return free_port_base([0], host)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different free ports (:func:`free_port`)."""
    return [free_port(host) for _ in range(count)]


def free_port_base(offsets: Sequence[int], host: str = "127.0.0.1") -> int:
    """A port ``P`` of this worker's slice with ``P + offset`` free on ``host`` now and in
    the slice for each of ``offsets`` (``[0]``: :func:`free_port`): a base for servers that
    take ports at fixed distances from it (the rendezvous ports of gangs sharing one host)."""
    global _next
    span = max(offsets)
    for _ in range(len(_POOL)):
        port = _POOL[_next % len(_POOL)]
        _next += 1
        if port + span < _POOL.stop and all(is_free(port + o, host) for o in offsets):
            return port
    raise RuntimeError(
        f"no free port (offsets {list(offsets)}) in {_POOL.start}-{_POOL.stop - 1} on {host}"
    )
