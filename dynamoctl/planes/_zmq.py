"""Small ZeroMQ helpers shared by the planes.

Every binding socket goes through :func:`secure_server` and every connecting one through
:func:`secure_client` (CURVE when the deployment has a key, :mod:`dynamoctl.planes.curve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from typing import Any

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
        _raise_open_files_limit()
    return zmq.asyncio.Context.instance()


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
