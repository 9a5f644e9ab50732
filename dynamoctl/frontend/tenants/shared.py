"""A key's limits held for the whole deployment, not per frontend process
(docs/security.md, "Limits"): several frontend processes or hosts take their budget from
one bucket per key and limit in the deployment's discovery (etcd, or the embedded store on
one host), by compare-and-set.

Rates. The shared bucket (:class:`~dynamoctl.wire.tenants.SharedBucket`) refills at the
key's limit per minute up to one limit, as one process's bucket would. A process whose
own part (:class:`~dynamoctl.frontend.tenants.limits.GrantedBucket`) runs out takes a
grant of 1 % of the limit (at least one request or token) and hands back in the same
write what its tokens overran (its part below zero). Everything served was taken from the
shared bucket first, so the deployment serves a key no more than one process would; what
it may serve less: the grants that processes hold unspent, at most one each (a process
asks only when its part is spent). A shared bucket found empty is not asked again until
it holds one unit: refusals meanwhile cost no round trip.

Concurrency. ``concurrent_requests`` is one count per key of the slots each process holds
(:class:`~dynamoctl.wire.tenants.SharedSlots`): a slot is taken before a request starts
and given back when it ends, so the key's requests in flight across the deployment never
exceed its limit. A process renews its slots' time every third of :data:`SLOT_TTL`; a
dead process's slots count until that time passes.

Discovery unreachable: a process grants itself, per ask, what the key's rate gave its
share (the limit over ``processes``) since its last grant, so an outage does not stop the
keys, and the deployment serves at most the limit meanwhile; slots are not counted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from dynamoctl.discovery import keys
from dynamoctl.discovery.api import DiscoveryError, Store
from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.tenants.limits import (
    SECONDS_PER_MINUTE,
    Bucket,
    GrantedBucket,
    KeyLimiter,
)
from dynamoctl.wire.tenants import SharedBucket, SharedSlots

log = logging.getLogger(__name__)

GRANT_SHARE = 0.01
"""A grant: this fraction of the key's limit, at least 1."""

SLOT_TTL = 30.0
"""Seconds a process's slots count without being renewed."""

TRIES = 16
"""Compare-and-set attempts before a grant is given up (counted as none)."""

Refusal = tuple[str, OpenAIError]


class SharedLimits:
    """This process's side of the shared limits of every key with limits."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        instance_id: str,
        processes: int,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.instance_id = instance_id
        self.processes = max(1, processes)
        self.wall = wall
        """Wall-clock time: the shared buckets' stamps are compared across hosts."""
        self.slots: dict[str, int] = {}
        """Slots held, by key name."""
        self.outages = 0
        """Grants taken while discovery was unreachable."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        """One change at a time per key and limit in this process (a grant read and
        written, a count of slots)."""

    async def admit(self, limiter: KeyLimiter) -> Refusal | None:
        """Admit one request of ``limiter``'s key, taking grants and a slot as needed;
        else the limit that refused it and the 429 (as :meth:`KeyLimiter.admit`)."""
        name = limiter.entry.name
        if limiter.requests is not None and limiter.requests.level < 1:
            await self._top_up(name, "requests", limiter.requests, 1.0)
        if limiter.tokens is not None and limiter.tokens.level <= 0:
            await self._top_up(name, "tokens", limiter.tokens, 1.0)  # above 0
        if (refused := limiter.refusal()) is not None:
            return refused
        limit = limiter.entry.limits.concurrent_requests
        if limit is not None:
            if not await self._slot(name, +1, limit):
                return limiter.too_many()
            if (refused := limiter.refusal()) is not None:  # spent by another meanwhile
                self._later(self._slot(name, -1))
                return refused
        limiter.take()
        return None

    def finished(self, limiter: KeyLimiter) -> None:
        """One request of ``limiter``'s key ended (after :meth:`KeyLimiter.release`): its
        slot goes back and its tokens' overrun is handed to the shared bucket."""
        name = limiter.entry.name
        if self.slots.get(name):  # held: given back even if a reload dropped the limit
            self._later(self._slot(name, -1))
        if limiter.tokens is not None and limiter.tokens.level < 0:
            self._later(self._top_up(name, "tokens", limiter.tokens, 0.0))

    async def renew(self) -> None:
        """Renew the time of the slots held, every third of :data:`SLOT_TTL`; runs until
        cancelled."""
        while True:
            await asyncio.sleep(SLOT_TTL / 3)
            for name, held in list(self.slots.items()):
                if held:
                    await self._slot(name, 0)

    async def close(self) -> None:
        """Wait for the slots and overruns still being handed back."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)

    def _lock(self, name: str, kind: str) -> asyncio.Lock:
        return self._locks.setdefault((name, kind), asyncio.Lock())

    async def _top_up(self, name: str, kind: str, bucket: Bucket | None, want: float) -> None:
        """Hand back ``bucket``'s overrun and, while it holds less than ``want`` (1 for
        requests; above 0 for tokens), take a grant (``want`` 0: only the overrun)."""
        assert isinstance(bucket, GrantedBucket)
        async with self._lock(name, kind):
            now = time.monotonic()
            short = bucket.level < want if kind == "requests" else bucket.level <= 0
            if want and (not short or now < bucket.empty_until):
                return  # topped up while this one waited, or known empty
            grant = max(1.0, bucket.limit * GRANT_SHARE) if want else 0.0
            overrun = max(0.0, -bucket.level)
            try:
                taken, left = await self._take(name, kind, bucket.limit, overrun, grant)
            except DiscoveryError as exc:
                taken, left = self._offline(bucket, grant, exc), 0.0
            bucket.level += overrun + taken
            if want and not taken:
                bucket.empty_until = now + max(0.0, want - left) / bucket.rate
            bucket.stamp, bucket.shared_left = now, left

    async def _take(
        self, name: str, kind: str, limit: int, overrun: float, grant: float
    ) -> tuple[float, float]:
        """(granted, left in the shared bucket) after one compare-and-set."""
        key = keys.key_limit_key(self.namespace, name, kind)
        for _ in range(TRIES):
            old = await self.store.get(key)
            wall = self.wall()
            level, stamp = float(limit), wall
            if old is not None:
                state = msgspec.msgpack.decode(old, type=SharedBucket)
                # A stamp ahead of this host's clock (skew) refills nothing, takes nothing.
                refill = max(0.0, wall - state.stamp) * limit / SECONDS_PER_MINUTE
                level, stamp = min(float(limit), state.level + refill), max(wall, state.stamp)
            level -= overrun
            taken = min(grant, max(0.0, level))
            if kind == "requests":
                taken = math.floor(taken)
            new = msgspec.msgpack.encode(SharedBucket(level - taken, stamp))
            if await self.store.replace(key, old, new):
                return taken, level - taken
        log.warning("shared limit %s/%s: contended %d times; no grant this time", name, kind, TRIES)
        return 0.0, 0.0

    def _offline(self, bucket: GrantedBucket, grant: float, exc: Exception) -> float:
        """A grant while discovery is unreachable: this process's share of the rate since
        its last grant."""
        self.outages += 1
        if self.outages == 1 or self.outages % 100 == 0:
            log.warning("shared limits: discovery unreachable (%s); granting locally", exc)
        share = (time.monotonic() - bucket.stamp) * bucket.rate / self.processes
        return min(grant, max(0.0, share))

    async def _slot(self, name: str, change: int, limit: int | None = None) -> bool:
        """Change this process's slots of ``name`` by ``change`` (0: renew their time);
        False when taking one would pass ``limit``."""
        key = keys.key_limit_key(self.namespace, name, "concurrency")
        async with self._lock(name, "concurrency"):
            return await self._count_slots(key, name, change, limit)

    async def _count_slots(self, key: str, name: str, change: int, limit: int | None) -> bool:
        mine = self.slots.get(name, 0) + change
        try:
            for _ in range(TRIES):
                old = await self.store.get(key)
                wall = self.wall()
                held = msgspec.msgpack.decode(old, type=SharedSlots).held if old else {}
                live = {i: h for i, h in held.items() if h[1] > wall and h[0] > 0}
                live.pop(self.instance_id, None)
                if (
                    limit is not None
                    and change > 0
                    and sum(h[0] for h in live.values()) + mine > limit
                ):
                    return False
                if mine > 0:
                    live[self.instance_id] = (mine, wall + SLOT_TTL)
                if await self.store.replace(key, old, msgspec.msgpack.encode(SharedSlots(live))):
                    break
        except DiscoveryError as exc:
            log.warning("shared limits: slots of %s not counted: %s", name, exc)
        self.slots[name] = max(0, mine)
        return True

    def _later(self, work: Coroutine[Any, Any, Any]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("shared limits: handing back failed")

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
