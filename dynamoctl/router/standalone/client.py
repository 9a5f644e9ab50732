"""The client of ``dynamoctl router`` (the standalone router's ``route`` endpoint), beside
its server: the live replicas of a namespace found in discovery
(``{ns}/instances/router/route/*``), each call spread round-robin over them with failover,
and the progress notifications batched to the replica that booked a request. A replica
that fails a call (killed, stalled past the timeout, erroring) is tried last for
``suspect_for`` seconds and the call moves on to the next one, so a replica killed
mid-call costs one timeout, not a failed request. The frontend's picker over it is
:mod:`dynamoctl.frontend.remote`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time

import msgspec

from dynamoctl.discovery import Discovery, EventKind, keys
from dynamoctl.discovery.hold import address_answers
from dynamoctl.planes.request import RemoteError, RequestClient, RequestPlaneError
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.records import Component, Endpoint, InstanceRecord, decode_json
from dynamoctl.wire.router import RouteAnswer, RouteEvent

log = logging.getLogger(__name__)

COMPONENT = Component.ROUTER
ROUTE = Endpoint.ROUTE
"""The router's request-plane endpoint (:mod:`dynamoctl.wire.router`)."""


class NoRouterAvailable(Exception):
    """No router replica answered (the frontend answers 503, as when no worker can take
    the request)."""

    def __init__(self, message: str, failed: list[str]) -> None:
        super().__init__(message)
        self.failed = failed
        """Replicas that failed the call (they may have booked it nonetheless)."""


class RouterReplicas(AsyncService):
    """The live router replicas of a namespace and the calls to them."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        *,
        timeout: float = 1.0,
        suspect_for: float = 5.0,
    ) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.timeout = timeout
        """Seconds a call may take before the next replica is asked."""
        self.suspect_for = suspect_for
        """Seconds a replica that failed a call is tried only after the others."""
        self.client = RequestClient(heartbeat_interval=0.5, heartbeat_timeout=2.0)
        self.failovers = 0
        """Calls that a replica failed and another one was asked (or none was left)."""
        self.notes_dropped = 0
        """Notifications that could not be delivered (their replica left or failed)."""
        self._replicas: dict[str, str] = {}  # instance id -> address
        self._suspect: dict[str, float] = {}  # instance id -> until when
        self._turn = itertools.count()
        self._notes: asyncio.Queue[tuple[str, RouteEvent]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def replicas(self) -> dict[str, str]:
        """Instance id → request-plane address of every replica in discovery."""
        return dict(self._replicas)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="router-replicas"),
            asyncio.create_task(self._notifier(), name="router-notes"),
        ]

    async def close(self) -> None:
        for task in [*self._tasks, *self._sending]:
            task.cancel()
        for task in [*self._tasks, *self._sending]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.client.close()

    # ------------------------------------------------------------------ calls

    async def call(self, body: bytes) -> tuple[str, RouteAnswer, list[str]]:
        """Ask replicas in turn until one answers: ``(its id, its answer, the ids of
        those that failed first)``. :class:`NoRouterAvailable` when none answers."""
        order = self._order()
        if not order:
            raise NoRouterAvailable(
                f"no router replica in discovery ({keys.instances_prefix(self.namespace)}"
                f"{COMPONENT}/{ROUTE}/): is `dynamoctl router -n {self.namespace}` running?",
                [],
            )
        failed: list[str] = []
        errors: list[str] = []
        for iid, address in order:
            try:
                answer = await asyncio.wait_for(self._call_one(address, body), self.timeout)
            except (RequestPlaneError, asyncio.TimeoutError) as exc:
                self.failovers += 1
                self._suspect[iid] = time.monotonic() + self.suspect_for
                failed.append(iid)
                errors.append(f"{iid}: {type(exc).__name__} {exc}".rstrip())
                log.warning("router replica %s failed a call (%s); failing over", iid, errors[-1])
                continue
            self._suspect.pop(iid, None)
            return iid, answer, failed
        raise NoRouterAvailable(f"no router replica answered: {'; '.join(errors)}", failed)

    def notify(self, iid: str, event: RouteEvent) -> None:
        """Send ``event`` to replica ``iid`` soon (batched, best effort)."""
        self._notes.put_nowait((iid, event))

    def _order(self) -> list[tuple[str, str]]:
        items = list(self._replicas.items())
        if not items:
            return []
        k = next(self._turn) % len(items)
        rotated = items[k:] + items[:k]
        now = time.monotonic()
        healthy = [r for r in rotated if self._suspect.get(r[0], 0.0) <= now]
        return healthy + [r for r in rotated if r not in healthy]

    async def _call_one(self, address: str, body: bytes) -> RouteAnswer:
        chunks = [chunk async for chunk in self.client.stream(address, ROUTE, body)]
        if len(chunks) != 1:
            raise RemoteError(f"router answered {len(chunks)} chunks, expected 1")
        try:
            return wire_router.decode_answer(chunks[0])
        except msgspec.DecodeError as exc:
            raise RemoteError(f"undecodable router answer: {exc}") from exc

    async def _notifier(self) -> None:
        while True:
            iid, event = await self._notes.get()
            batches: dict[str, list[RouteEvent]] = {iid: [event]}
            while not self._notes.empty():
                iid, event = self._notes.get_nowait()
                batches.setdefault(iid, []).append(event)
            for iid, events in batches.items():  # one slow replica must not hold up others
                task = asyncio.create_task(self._send_notes(iid, events), name="router-note")
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send_notes(self, iid: str, events: list[RouteEvent]) -> None:
        address = self._replicas.get(iid)
        if address is None:
            self.notes_dropped += len(events)
            return
        body = wire_router.encode(wire_router.RouteNotify(events))
        try:
            await asyncio.wait_for(self._drain(address, body), self.timeout)
        except (RequestPlaneError, asyncio.TimeoutError) as exc:
            self.notes_dropped += len(events)
            log.debug("%d notification(s) to router %s lost: %r", len(events), iid, exc)

    async def _drain(self, address: str, body: bytes) -> None:
        async for _ in self.client.stream(address, ROUTE, body):
            pass

    # ------------------------------------------------------------------ discovery

    async def _answers(self, key: str) -> bool:
        """Whether a replica whose record is held still accepts connections."""
        address = self._replicas.get(key.rpartition("/")[2])
        return address is not None and await address_answers(address)

    async def _watch(self) -> None:
        # Held while discovery settles: replicas that answer are asked as before.
        prefix = keys.instances_prefix(self.namespace, COMPONENT)
        async for event in self.discovery.watch(prefix, hold=True, alive=self._answers):
            try:
                _, _, endpoint, iid = keys.split_instance_key(event.key)
                if endpoint != ROUTE:
                    continue
                old = self._replicas.pop(iid, None)
                if event.kind is EventKind.PUT:
                    assert event.value is not None
                    address = decode_json(event.value, InstanceRecord).address
                    self._replicas[iid] = address
                    log.info("router replica %s at %s", iid, address)
                else:
                    self._suspect.pop(iid, None)
                    log.info("router replica %s left", iid)
                if old is not None and old != self._replicas.get(iid):
                    await self.client.disconnect(old)  # its open calls fail over now
            except (ValueError, msgspec.DecodeError) as exc:
                log.warning("ignoring router record %s: %s", event.key, exc)
