"""A node-local relay that carries an engine's own KV event stream onto the deployment's
encrypted event plane (docs/security.md, "The engines' KV event streams").

vLLM and SGLang publish their KV events themselves, on ZeroMQ sockets that cannot speak
CURVE. When such a publisher is bound where only its node reaches it (``ipc://`` or a
loopback ``tcp://``) and the deployment has a CURVE key, the worker runs this relay: a
SUB on the engine's PUB re-publishes every message, frames untouched, on a CURVE PUB on
the worker's address, and a CURVE ROUTER forwards each subscriber's replay requests to
the engine's replay ROUTER through a DEALER of its own (so the engine sees each
subscriber as the one client it expects, and replies go back to whoever asked). Routers
then subscribe to the relay as to any worker's own stream (``kv_curve: true``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections import OrderedDict
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from dynamoctl.planes import _zmq

log = logging.getLogger(__name__)

MAX_REPLAY_CLIENTS = 256
"""Upstream DEALERs kept at once (one per subscriber that asked a replay); the least
recently used is closed beyond it (its next request opens a fresh one)."""


def node_local(address: str) -> bool:
    """Whether only this node can reach ``address``: ``ipc://`` or a loopback ``tcp://``."""
    if address.startswith("ipc://"):
        return True
    if not address.startswith("tcp://"):
        return False
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KvEventRelay:
    """Relays one engine's node-local KV stream (PUB and replay ROUTER) under CURVE."""

    def __init__(self, address: str, replay_address: str | None, host: str) -> None:
        self.address = address
        """The engine's PUB."""
        self.replay_address = replay_address
        """The engine's replay ROUTER, if it has one."""
        self.host = f"[{host}]" if ":" in host else host
        self._ctx = _zmq.async_context()
        self._tasks: list[asyncio.Task[None]] = []
        self._socks: list[zmq.asyncio.Socket] = []
        self._upstream: OrderedDict[bytes, tuple[zmq.asyncio.Socket, asyncio.Task[None]]] = (
            OrderedDict()
        )

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self._socks.append(sock)
        return sock

    async def start(self) -> tuple[str, str | None]:
        """Bind the relay's sockets; their addresses (PUB, replay ROUTER) to register in
        place of the engine's."""
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.address)  # in the clear: the engine's, on this node only
        pub = self._socket(zmq.PUB)
        _zmq.secure_server(pub)
        address = await _zmq.bind(pub, f"tcp://{self.host}:0")
        self._tasks.append(asyncio.create_task(self._live(sub, pub), name="kv-relay-live"))
        replay = None
        if self.replay_address is not None:
            router = self._socket(zmq.ROUTER)
            _zmq.secure_server(router)
            replay = await _zmq.bind(router, f"tcp://{self.host}:0")
            self._tasks.append(asyncio.create_task(self._replays(router), name="kv-relay-replay"))
        log.info("[kv-relay] the engine's KV events %s are relayed under CURVE at %s",
                 self.address, address)  # fmt: skip
        return address, replay

    async def close(self) -> None:
        for task in self._tasks + [task for _, task in self._upstream.values()]:
            task.cancel()
        for task in self._tasks + [task for _, task in self._upstream.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self._socks + [sock for sock, _ in self._upstream.values()]:
            _zmq.close(sock)
        self._tasks, self._socks = [], []
        self._upstream.clear()

    @staticmethod
    async def _live(sub: zmq.asyncio.Socket, pub: zmq.asyncio.Socket) -> None:
        while True:
            await pub.send_multipart(await sub.recv_multipart())

    async def _replays(self, router: zmq.asyncio.Socket) -> None:
        while True:
            client, *request = await router.recv_multipart()
            dealer = self._dealer_of(client, router)
            await dealer.send_multipart(request)

    def _dealer_of(self, client: bytes, router: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
        found = self._upstream.get(client)
        if found is not None:
            self._upstream.move_to_end(client)
            return found[0]
        if len(self._upstream) >= MAX_REPLAY_CLIENTS:
            _, (old, task) = self._upstream.popitem(last=False)
            task.cancel()
            _zmq.close(old)
        assert self.replay_address is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_address)
        task = asyncio.create_task(self._answers(client, dealer, router), name="kv-relay-answer")
        self._upstream[client] = (dealer, task)
        return dealer

    @staticmethod
    async def _answers(
        client: bytes, dealer: zmq.asyncio.Socket, router: zmq.asyncio.Socket
    ) -> None:
        while True:
            await router.send_multipart([client, *await dealer.recv_multipart()])
