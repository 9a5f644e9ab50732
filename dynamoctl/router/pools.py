"""A model's two routers for disaggregated serving (docs/architecture.md), as the frontend's
embedded picker and ``dynamoctl router`` both keep them: ``main`` over the ``agg`` and
``decode`` workers (every request ends there) and ``prefill`` over the ``prefill``
workers (prefill workers only ever prefill, so ``main`` never sends them a request).

Picks name a :data:`~dynamoctl.wire.router.RoutePool`: ``default`` and ``decode`` book
on ``main`` (``decode``: no overlap credit, nothing to prefill: the KV comes from a
prefill worker), ``prefill`` on ``prefill``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from dynamoctl.discovery import Discovery
from dynamoctl.router.router import Decision, KvRouter
from dynamoctl.router.service import RouterService
from dynamoctl.wire.records import InstanceRecord
from dynamoctl.wire.roles import DECODE_ROLES, PREFILL_ROLES
from dynamoctl.wire.router import BookingPool, RoutePool


class Picked(NamedTuple):
    decision: Decision
    record: InstanceRecord
    """The chosen worker's discovery record (its address)."""


def booking_pool(pool: RoutePool) -> BookingPool:
    """Which router a pick in ``pool`` books on."""
    return "prefill" if pool == "prefill" else "default"


class ModelPools:
    """``main`` and ``prefill`` routers of one model, fed from discovery."""

    def __init__(self, main: RouterService, prefill: RouterService) -> None:
        self.main = main
        self.prefill = prefill
        self._disaggregated: tuple[tuple[int, int], bool] = ((-1, -1), False)

    @classmethod
    async def open(
        cls, discovery: Discovery, namespace: str, model: str, build: Callable[[], KvRouter]
    ) -> ModelPools:
        def service(roles: tuple[str, ...]) -> RouterService:
            return RouterService(discovery, namespace, model, build(), roles=roles)

        # The main router serves every worker that decodes; the prefill router those that
        # only prefill (an agg worker prefills its own requests).
        decoders, prefill_only = DECODE_ROLES, PREFILL_ROLES - DECODE_ROLES
        pools = cls(service(tuple(sorted(decoders))), service(tuple(sorted(prefill_only))))
        await pools.main.start()
        await pools.prefill.start()
        return pools

    async def close(self) -> None:
        await self.main.close()
        await self.prefill.close()

    def router(self, pool: BookingPool) -> KvRouter:
        return self.prefill.router if pool == "prefill" else self.main.router

    def disaggregated(self) -> bool:
        """Whether the model has prefill or decode workers (else it is aggregated)."""
        # Asked for every request: recomputed only when either pool's workers change.
        main = self.main
        key = (main.generation, self.prefill.generation)
        if key != self._disaggregated[0]:
            answer = bool(self.prefill_workers()) or any(
                (record := main.instance(w)) is not None and record.role == "decode"
                for w in main.router.workers()
            )
            self._disaggregated = (key, answer)
        return self._disaggregated[1]

    def prefill_workers(self) -> int:
        return len(self.prefill.router.workers())

    def decode_cached_tokens(self, token_ids: Sequence[int]) -> int:
        """Most leading prompt tokens cached on one agg or decode worker."""
        router = self.main.router
        return max(router.find_matches(token_ids).values(), default=0) * router.block_size

    def pick(
        self,
        pool: RoutePool,
        token_ids: Sequence[int],
        request_id: str,
        exclude: set[str] | list[str],
        headroom: float = 0.0,
    ) -> Picked:
        """Pick (and book) a worker of ``pool``; raises :class:`RouterError`.

        A worker whose record has left discovery while the router still holds it (its
        removal waits behind a subscription change) is skipped and the pick made again:
        a request that could go to another worker never fails because one just died.
        ``headroom``: the busy thresholds' fraction the request's class may not fill."""
        service = self.prefill if pool == "prefill" else self.main
        decode = pool == "decode"
        left: set[str] = set()
        while True:
            decision = service.router.pick(
                token_ids,
                request_id,
                exclude=left.union(exclude) if left else exclude,
                overlap_weight=0.0 if decode else None,
                prefilled=decode,
                headroom=headroom,
            )
            record = service.instance(decision.worker_id)
            if record is not None:
                return Picked(decision, record)
            service.router.on_finished(request_id)
            left.add(decision.worker_id)  # ends: each turn excludes one more worker
