"""Withdraw a dead instance's discovery records the moment its process ends.

A process that dies leaves its records in discovery until its lease expires (``--lease-ttl``,
10 s by default): frontends and routers would keep sending it requests that wait out a
heartbeat. The supervisor knows at once (its ``proc.wait()`` returns), so before it
restarts the instance it deletes what the dead process registered (docs/operations.md,
"When a process dies").

Which records: every instance record in the namespace whose ``label`` is the instance's
name (what ``status`` shows; the supervisor passes it as ``--label``), and the events
records of those instance ids. The process that wrote them has ended and its successor
has not started yet, so every record with that label belongs to a dead process. Model
cards are left to the lease: they say what a model is, not where to send, and removing
the last one would make the model vanish (404) while its replacement starts.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from dynamoctl.discovery import keys
from dynamoctl.discovery.api import Store
from dynamoctl.discovery.registry import store_from_url
from dynamoctl.launch.api import InstanceSpec
from dynamoctl.wire.records import InstanceRecord, decode_json

log = logging.getLogger(__name__)

WITHDRAW_TIMEOUT = 2.0
"""Seconds a withdrawal may take: an unreachable discovery must not hold up the restart
(the lease's expiry removes the records anyway)."""


class RecordWithdrawal:
    """Deletes the records of an instance whose process ended; one store connection,
    opened on first use (a managed etcd starts after the supervisor)."""

    def __init__(self, discovery_url: str, namespace: str) -> None:
        self.discovery_url = discovery_url
        self.namespace = namespace
        self._store: Store | None = None

    async def ended(self, spec: InstanceSpec) -> list[str]:
        """The process of ``spec`` ended: withdraw its records (a managed etcd has none,
        and is the store itself)."""
        return [] if spec.component == "etcd" else await self.withdraw(spec.name)

    async def withdraw(self, label: str) -> list[str]:
        """Delete the records of the instance named ``label``; the keys deleted. Never
        raises: a failure is logged, and the lease's expiry is the backstop."""
        try:
            return await asyncio.wait_for(self._withdraw(label), WITHDRAW_TIMEOUT)
        except Exception as exc:  # whatever failed, the lease's expiry is the backstop
            log.warning(
                "%s: could not withdraw its discovery records (%s); its lease will expire",
                label, str(exc) or type(exc).__name__,
            )  # fmt: skip
            return []

    async def _withdraw(self, label: str) -> list[str]:
        if self._store is None:
            self._store = store_from_url(self.discovery_url)
        store, ns = self._store, self.namespace
        stored = (await store.list(keys.namespace_prefix(ns))).items
        instances = keys.instances_prefix(ns)
        doomed: list[str] = []
        for key, value in stored.items():
            if not key.startswith(instances):
                continue
            try:
                record = decode_json(value, InstanceRecord)
                _, component, _, iid = keys.split_instance_key(key)
            except (msgspec.DecodeError, ValueError):
                continue  # not a record this supervisor wrote: not ours to judge
            if record.label == label:
                doomed.append(key)  # first: the instance record is what routers follow
                events = keys.events_key(ns, component, iid)
                if events in stored:
                    doomed.append(events)
        for key in doomed:
            await store.delete(key)
        if doomed:
            log.info("%s: withdrew %d discovery record(s) of its ended process", label, len(doomed))
        return doomed

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()
