"""Small ZeroMQ helpers shared by the planes.

Every binding socket goes through :func:`secure_server` and every connecting one through
:func:`secure_client` (CURVE when the deployment has a key, :mod:`dynamoctl.planes.curve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from typing import Any, Final

import zmq
import zmq.asyncio

from dynamoctl.planes.curve import secure_client, secure_server
from dynamoctl.util.backoff import Backoff

__all__ = [
    "MAX_SOCKETS",
    "async_context",
    "bind",
    "close",
    "secure_client",
    "secure_server",
    "sync_context",
]

MAX_SOCKETS = 65536
"""ZeroMQ's default (1023) is reached by a frontend or router following ~100 workers: each
costs several sockets (request DEALER, KV and load SUB, their replay DEALERs)."""


def async_context() -> zmq.asyncio.Context:
    """The process-wide asyncio context (one I/O thread for every plane)."""
    current = zmq.asyncio.Context._instance
    if current is None or current.closed:  # sized before its first socket, or never
        ctx = zmq.asyncio.Context.instance()
        ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
        if _batch_policy_allowed():
            ctx.set(zmq.THREAD_SCHED_POLICY, _SCHED_BATCH)
        _raise_open_files_limit()
    return zmq.asyncio.Context.instance()


_SCHED_BATCH: Final = getattr(os, "SCHED_BATCH", -1)


def _batch_policy_allowed() -> bool:
    """Whether this thread may take ``SCHED_BATCH``, tried on a throwaway thread.

    ZeroMQ's I/O thread runs under ``SCHED_BATCH`` (Linux) where allowed: a thread under
    it never preempts the running one when it wakes. Without it, every message handed to
    the I/O thread (a send, or data it read for us) woke it onto our core at once, and
    the event loop stopped mid-turn for it. On the 2-core benchmark machine the policy
    gives the serving path x1.29-1.47 the req/s at 8-128 streams, the workers two thirds
    of the CPU per request, and no loss with two deployments sharing the cores
    (docs/benchmarks.md, "eleventh session"). It still runs as soon as a core is idle,
    at the same weight. ZeroMQ aborts the process if it cannot set the policy, hence the
    trial with the same call first (a seccomp filter may refuse it).
    """
    if _SCHED_BATCH < 0:
        return False
    allowed: list[bool] = []

    def attempt() -> None:
        try:  # pid 0: the calling thread only
            os.sched_setscheduler(0, _SCHED_BATCH, os.sched_param(0))
            allowed.append(True)
        except OSError:
            pass

    trial = threading.Thread(target=attempt, name="sched-batch-trial")
    trial.start()
    trial.join()
    return bool(allowed)


def _raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: each ZeroMQ socket and connection is a file
    descriptor, and soft limits of 1024 are common (vLLM raises it the same way)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = MAX_SOCKETS if hard == resource.RLIM_INFINITY else hard
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


def sync_context() -> zmq.Context[zmq.Socket[bytes]]:
    """A blocking view of the same context, for sockets that only ever send without
    waiting (PUB): a synchronous ``send`` avoids creating a Future per message."""
    return zmq.Context.shadow(async_context().underlying)


async def bind(sock: zmq.Socket[Any], address: str, *, patience: float = 2.0) -> str:
    """Bind ``sock`` and return the resolved address.

    ``tcp://host:0`` is accepted as a synonym of ZeroMQ's ``tcp://host:*`` (an ephemeral
    port); the returned address names the port actually bound, ready to publish in
    discovery. EADDRINUSE is retried for ``patience`` seconds: ZeroMQ releases a closed
    socket's port asynchronously, so a component restarted in-process on its old address
    would otherwise race its predecessor. On failure ``sock`` is closed.
    """
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-1] + "*"
    backoff, deadline = Backoff(base=0.01, cap=0.2), time.monotonic() + patience
    while True:
        try:
            sock.bind(address)
            break
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                close(sock)
                raise
            await asyncio.sleep(backoff.next())
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return endpoint.decode()


def close(sock: zmq.Socket[Any] | None) -> None:
    """Close at once: pending outgoing messages are dropped (linger 0) so that shutdown
    never blocks on an unreachable peer."""
    if sock is not None and not sock.closed:
        sock.close(linger=0)
