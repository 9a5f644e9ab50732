"""How the planner reaches the supervisor: its control endpoint, found in discovery (the
supervisor registers it once the deployment serves), with the token the supervisor hands
the planner as a secret. Scaling goes through ``POST /scale`` only, so that every
scale-down is a drain (docs/planner.md, "The running planner")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter

import msgspec

from dynamoctl.control.client import ControlClient, ControlError
from dynamoctl.discovery import Discovery, DiscoveryError, keys
from dynamoctl.security import names
from dynamoctl.settings.component import Role
from dynamoctl.util.backoff import Backoff
from dynamoctl.wire.control import StatusReport
from dynamoctl.wire.records import Component, Endpoint, InstanceRecord, decode_json
from dynamoctl.wire.states import State

log = logging.getLogger(__name__)


def pool_counts(report: StatusReport, roles: list[Role]) -> tuple[dict[Role, int], dict[Role, int]]:
    """(replicas wanted, replicas READY) per pool in ``report``: a gang counts once (its
    leader), drained and stopped replicas not at all."""
    gone = (State.DRAINING, State.STOPPED, State.FAILED)
    wanted = dict.fromkeys(roles, 0)
    ready = dict.fromkeys(roles, 0)
    for row in report.instances:
        role = next((r for r in roles if r == row.pool), None)
        if role is None or row.component != "worker" or row.rank or row.state is State.STANDBY:
            continue  # a warm spare is no replica until promoted
        if row.state not in gone:
            wanted[role] += 1
        if row.state is State.READY:
            ready[role] += 1
    return wanted, ready


class SupervisorLink:
    """The supervisor's control endpoint, and scale requests retried until they succeed
    or a newer target replaces them."""

    def __init__(self, discovery: Discovery, namespace: str, backoff: Backoff) -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.backoff = backoff
        self.token = os.environ.get(names.CONTROL_TOKEN, "")
        self._client: ControlClient | None = None
        self._url = ""
        self._pending: dict[Role, int] = {}
        self._tasks: dict[Role, asyncio.Task[None]] = {}
        self.failures: Counter[Role] = Counter()
        """Scale requests that failed, per pool (each is retried)."""
        self.error = ""
        """The last failure, in words; empty once a request succeeds."""

    async def _find(self) -> ControlClient | None:
        prefix = keys.instances_prefix(self.namespace, Component.SUPERVISOR)
        for key, value in (await self.discovery.list(prefix)).items():
            if keys.split_instance_key(key)[2] != Endpoint.CONTROL:
                continue
            with contextlib.suppress(msgspec.DecodeError):
                url = decode_json(value, InstanceRecord).address
                if url != self._url:
                    self._close_client()
                    self._client, self._url = ControlClient(url, self.token), url
                    log.info("supervisor control endpoint at %s", url)
                return self._client
        return None

    async def status(self) -> StatusReport | None:
        """The deployment's status; None while no supervisor is registered or it does not
        answer (the planner then holds)."""
        try:
            client = await self._find()
            if client is None:
                return None
            return await asyncio.to_thread(client.status)
        except (ControlError, DiscoveryError) as exc:
            log.warning("supervisor status: %s", exc)
            self._close_client()  # found again next time (a restarted supervisor)
            return None

    def pending(self, role: Role) -> bool:
        """Whether a scale request of ``role`` is still being tried."""
        return role in self._pending

    def scale(self, role: Role, replicas: int) -> None:
        """Ask for ``replicas`` of ``role`` now, and again with backoff until it succeeds."""
        self._pending[role] = replicas
        task = self._tasks.get(role)
        if task is None or task.done():
            self._tasks[role] = asyncio.create_task(self._apply(role), name=f"scale-{role}")

    async def _apply(self, role: Role) -> None:
        backoff = Backoff(self.backoff.base, self.backoff.cap)
        while role in self._pending:
            replicas = self._pending[role]
            try:
                client = await self._find()
                if client is None:
                    raise ControlError("no supervisor control endpoint in discovery")
                reply = await asyncio.to_thread(client.scale, role, replicas, by_planner=True)
            except (ControlError, DiscoveryError, OSError) as exc:
                self.failures[role] += 1
                delay = backoff.next()
                self.error = f"scale {role}={replicas} failed: {exc}; retrying in {delay:.1f} s"
                log.warning("%s", self.error)
                await asyncio.sleep(delay)
                continue
            done = ", ".join([*reply.started, *(f"draining {n}" for n in reply.drained)])
            log.info("scaled %s to %d: %s", role, replicas, done or "nothing to change")
            self.error = ""
            if self._pending.get(role) == replicas:
                del self._pending[role]

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client, self._url = None, ""

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._close_client()
