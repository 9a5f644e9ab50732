"""What the frontend asks a router and what it answers: one picker protocol, shared by
the request pipeline, disaggregation and both routings (embedded and standalone)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol


class WorkerChoice(NamedTuple):
    worker_id: str
    address: str
    label: str = ""
    """The worker's name in ``dynamoctl status`` (``agg-1``), when it has one."""

    @property
    def name(self) -> str:
        """How logs name the worker: as ``status`` does, with its instance id."""
        return f"{self.label} ({self.worker_id})" if self.label else self.worker_id


class NoWorkerAvailable(Exception):
    """No worker can take the request now (none serving, all busy, or all excluded)."""

    def __init__(self, message: str, *, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy
        """Workers exist but all are over their busy thresholds: waiting may help."""


class PoolSurvey(NamedTuple):
    """What the disaggregation decision needs to know about a request's pools."""

    prefill_workers: int
    """Prefill workers alive now."""
    decode_cached_tokens: int
    """Most leading prompt tokens cached on one decode (or agg) worker."""


class WorkerPicker(Protocol):
    """A model's router, as the frontend uses it (embedded or standalone).

    The picks are coroutines because a standalone router is asked over the network; the
    notifications are not: they must never hold up the token stream (a standalone router
    gets them batched, in the background).
    """

    async def pick(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        """Choose a worker (agg or decode) for the whole request; raises
        :class:`NoWorkerAvailable`."""
        ...

    def first_token(self, request_id: str) -> None:
        """The request's prefill is done: release its booked prefill load."""
        ...

    def finished(self, request_id: str) -> None:
        """The request ended (any way): release everything booked for it."""
        ...

    def disaggregated(self) -> bool:
        """Whether the model has prefill or decode workers (else it is aggregated); a
        picker that does not know yet answers True, and :meth:`survey` finds out."""
        ...

    async def survey(self, token_ids: Sequence[int], request_id: str) -> PoolSurvey:
        """The pools as they stand for this prompt. The standalone picker asks its
        router with the request's ordinary pick and keeps that pick for ``pick``, so a
        request prefilled locally costs one round trip, as an aggregated one does."""
        ...

    async def pick_prefill(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        """A prefill worker, KV-aware; raises :class:`NoWorkerAvailable` (``busy``: all
        saturated)."""
        ...

    def prefill_finished(self, request_id: str) -> None:
        """Release what :meth:`pick_prefill` booked."""
        ...

    async def pick_decode(
        self, token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        """A decode worker for a remotely prefilled prompt: no overlap credit."""
        ...


PickFn = Callable[[Sequence[int], str, set[str]], Awaitable[WorkerChoice]]
"""``(token_ids, request_id, exclude) -> choice``: a picker's ``pick``, ``pick_decode`` or
``pick_prefill``."""


class Reachability(Protocol):
    """What the request plane knows of a worker's address (``RequestClient``)."""

    def peer_down(self, address: str) -> bool:
        """Its connection closed, or it is silent: do not send it a request now."""
        ...

    def peer_silent(self, address: str) -> bool:
        """Connected but not answering heartbeats: frozen, or only stalled."""
        ...


def skip_unreachable(pick: PickFn, peers: Reachability) -> PickFn:
    """``pick``, re-picked while its choice is at an address the request plane knows is
    down (``peer_down``: the worker's process died, and discovery may not know yet, or it
    is silent). A dead worker joins ``exclude`` for the rest of the request; a silent one
    is only skipped by this pick, and if no other is left the pick is refused as busy, so
    the admission queue waits (``queue_timeout``) for it to answer again instead of
    failing a request, or a migrating stream, because a worker stalled for a moment.
    Re-picking under the same request id replaces the skipped pick's booking."""

    async def pick_reachable(
        token_ids: Sequence[int], request_id: str, exclude: set[str]
    ) -> WorkerChoice:
        silent: set[str] = set()
        while True:
            try:
                choice = await pick(token_ids, request_id, exclude | silent if silent else exclude)
            except NoWorkerAvailable as exc:
                if not silent or exc.busy:
                    raise
                raise NoWorkerAvailable(
                    f"{exc}; {len(silent)} more not answering heartbeats", busy=True
                ) from exc
            if not peers.peer_down(choice.address):
                return choice
            (silent if peers.peer_silent(choice.address) else exclude).add(choice.worker_id)

    return pick_reachable
