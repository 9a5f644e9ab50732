"""Whether a request-plane server is still there, from its TCP connection's fate.

A process that dies (SIGKILL, OOM, a crash) has its TCP connections closed by the kernel
at once, long before a heartbeat times out. ZeroMQ reports that on a socket monitor as
``EVENT_DISCONNECTED``; the DEALER then keeps reconnecting to the address in the
background, and ``EVENT_HANDSHAKE_SUCCEEDED`` says a server answers there again (a worker
restarted on a fixed port; restarted workers normally bind a new ephemeral port, so the
old address stays down until the client drops it). See docs/planes.md, "Dead peers".
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from typing import Any, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from dynamoctl.planes import _zmq

logger = logging.getLogger(__name__)

_WATCHED = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class PeerState(enum.Enum):
    """What a connection's monitor knows of its server.

    Transitions: UNKNOWN → UP (handshake) → DOWN (disconnected) → UP (a server answers at
    the address again) → ...; UNKNOWN → DOWN cannot happen (nothing to lose yet).
    """

    UNKNOWN = "unknown"
    """Not connected yet (the server may not listen yet): heartbeats decide."""
    UP = "up"
    """A server completed the ZMTP handshake on this connection."""
    DOWN = "down"
    """The connection was closed under us: the server process is gone (or restarting)."""


class PeerWatch:
    """A ZeroMQ monitor on one connecting socket, pumped by the event loop.

    Create it before the socket connects (so the first handshake is seen); ``on_change``
    is called with the new state on every change. :meth:`close` before closing the
    socket.
    """

    def __init__(self, sock: zmq.Socket[Any], on_change: Callable[[PeerState], None]) -> None:
        self.state = PeerState.UNKNOWN
        self._sock = sock
        self._on_change = on_change
        self._monitor: zmq.Socket[Any] = sock.get_monitor_socket(_WATCHED)
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, self._monitor.get(zmq.FD))
        self._closed = False
        self._loop.add_reader(self._fd, self._drain)
        # ZeroMQ signals the descriptor only after a read found nothing: read once now.
        self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Read every pending monitor event (the descriptor is edge-triggered: drain, then
        check ``EVENTS`` in case one slipped in meanwhile)."""
        monitor = self._monitor
        while not self._closed:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if not cast(int, monitor.get(zmq.EVENTS)) & zmq.POLLIN:
                    return
                continue
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._set(PeerState.DOWN)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._set(PeerState.UP)

    def _set(self, state: PeerState) -> None:
        if state is not self.state:
            self.state = state
            self._on_change(state)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError as exc:  # the socket is already closed: nothing to disable
            logger.debug("disable_monitor: %s", exc)
        _zmq.close(self._monitor)
