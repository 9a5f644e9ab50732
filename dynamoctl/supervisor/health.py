"""Readiness and liveness probes the supervisor runs against its instances.

An instance is healthy when its process is alive, its discovery record is there (for
workers: live lease) and it answers. A worker with requests in flight whose generated-token
counter stops moving is hung even though it answers (docs/operations.md): an engine stuck in a
CUDA call still serves ``/metrics`` from another thread. While discovery is unreachable, and
for :data:`SETTLE_S` after it comes back (leases that expired during the outage take a
moment to be re-established), an instance is judged by its last known record: a worker
"not registered" only because of the outage is not killed as hung.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TypeVar

import httpx
import msgspec

from dynamoctl.discovery.api import Store
from dynamoctl.discovery.keys import instances_prefix
from dynamoctl.wire.control import DiscoveryStatus
from dynamoctl.wire.records import InstanceRecord

log = logging.getLogger(__name__)

H = TypeVar("H", bound=msgspec.Struct)

SETTLE_S = 10.0
"""Seconds after discovery comes back during which a missing record is not yet believed
(the default lease TTL: every process re-registers well within it)."""


class Probes:
    """HTTP probes sharing one client, and the namespace's instance records by label."""

    def __init__(
        self,
        store: Store | None,
        namespace: str,
        max_age: float = 0.0,
        timeout: float = 2.0,
        api_key: str | None = None,
        health_timeout: float = 1.0,
    ) -> None:
        self.health_timeout = health_timeout
        """Seconds a READY instance's health probe waits (``supervision.probe_timeout``);
        readiness probes (a one-token completion) keep the client's longer ``timeout``."""
        self.store = store
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        """The frontend's API key, when it has keys (never logged)."""
        self.namespace = namespace
        self.max_age = max_age
        """Seconds a listing serves every instance's probe before discovery is asked again."""
        self.http = httpx.AsyncClient(timeout=timeout, trust_env=False)
        self.records: dict[str, InstanceRecord] = {}
        """The latest instance records, by supervisor label."""
        self.every_record: dict[str, list[InstanceRecord]] = {}
        """Each label's records: a killed process's stays beside its successor's until
        its lease expires."""
        self._listed_at = -math.inf
        self._last_known: dict[str, InstanceRecord] = {}
        """Every label's last record, kept after it vanished (see :meth:`record_of`)."""
        self._down_since: float | None = None
        self._down_error = ""
        self._back_at = -math.inf

    async def refresh_records(self) -> None:
        """Re-list ``{ns}/instances/`` unless a listing younger than ``max_age`` is at hand
        (each instance's probe asks; one listing per round serves them all). Keeps the last
        view when discovery is unreachable."""
        if self.store is None or time.monotonic() - self._listed_at < self.max_age:
            return
        self._listed_at = time.monotonic()
        try:
            listing = await self.store.list(instances_prefix(self.namespace))
        except Exception as exc:  # an outage: instances keep their last known records
            self._went_down(exc)
            return
        self._came_back()
        every: dict[str, list[InstanceRecord]] = {}
        for value in listing.items.values():
            try:
                record = msgspec.json.decode(value, type=InstanceRecord)
            except msgspec.DecodeError:
                continue
            if record.label:
                every.setdefault(record.label, []).append(record)
        self.every_record = every
        self.records = {label: found[-1] for label, found in every.items()}
        self._last_known.update(self.records)

    def record_of(self, label: str) -> InstanceRecord | None:
        """``label``'s record; while discovery is unreachable or settling, its last known
        one (a record that vanished with an outage says nothing about the process)."""
        record = self.records.get(label)
        if record is None and self.settling():
            record = self._last_known.get(label)
        return record

    @property
    def reachable(self) -> bool:
        """Whether the last listing succeeded: :attr:`records` is current."""
        return self._down_since is None

    def settling(self) -> bool:
        """Unreachable now, or back for less than :data:`SETTLE_S`."""
        return self._down_since is not None or time.monotonic() - self._back_at < SETTLE_S

    def discovery_status(self) -> DiscoveryStatus:
        """What ``status`` says about discovery."""
        location = self.store.location if self.store is not None else ""
        if self._down_since is None:
            return DiscoveryStatus(reachable=True, location=location)
        return DiscoveryStatus(
            reachable=False,
            location=location,
            unreachable_s=time.monotonic() - self._down_since,
            error=self._down_error,
        )

    def _went_down(self, exc: Exception) -> None:
        self._down_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "discovery unreachable (%s): instances are judged by their last known "
                "records until it is back",
                self._down_error,
            )

    def _came_back(self) -> None:
        if self._down_since is not None:
            log.info(
                "discovery reachable again after %.1fs",
                time.monotonic() - self._down_since,
            )
            self._down_since = None
            self._back_at = time.monotonic()

    async def store_answers(self) -> bool:
        """Whether discovery answers a read (a TLS etcd's ``/health`` wants a client
        certificate, which the store presents)."""
        if self.store is None:
            return False
        try:
            await self.store.get(instances_prefix(self.namespace))
        except Exception:
            return False
        return True

    async def ok(self, url: str) -> bool:
        try:
            return (await self.http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def frontend_ready(self, base: str, model: str) -> bool:
        """The frontend lists ``model`` and completes a one-token request (embeds a word,
        for an embedding model: the completion is its 400)."""
        try:
            models = (await self.http.get(f"{base}/models", headers=self._auth)).json()
            if model not in {m.get("id") for m in models.get("data", [])}:
                return False
            body: dict[str, object] = {"model": model, "prompt": "ready?", "max_tokens": 1}
            answer = await self.http.post(f"{base}/completions", json=body, headers=self._auth)
            if answer.status_code == 400:
                body = {"model": model, "input": "ready?"}
                answer = await self.http.post(f"{base}/embeddings", json=body, headers=self._auth)
            return answer.status_code == 200
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    async def reply(self, url: str) -> httpx.Response | None:
        """``url``'s answer within ``health_timeout``, whatever its status; None when the
        process gave none (frozen, deadlocked, not listening): a silence."""
        try:
            return await self.http.get(url, timeout=self.health_timeout)
        except httpx.HTTPError:
            return None

    async def close(self) -> None:
        await self.http.aclose()
        if self.store is not None:
            await self.store.close()
