"""Disaggregated prefill/decode, the frontend's part (docs/architecture.md).

Before a request is decoded, :class:`Prefiller` decides where its prompt is computed:

========================================  ==============================================
prefill pool of the model                 decision (mode ``auto``)
========================================  ==============================================
no prefill worker alive                   aggregated on the decode pool (a *fallback*;
                                          ``required``: 503)
uncached prompt < ``min_remote_prefill``  *local* prefill on the decode worker
every prefill worker busy (saturated)     *local* prefill (``required``: 503, retry later)
otherwise                                 *remote*: a prefill worker picked KV-aware runs
                                          it with ``max_tokens=1``; its hand-off goes to
                                          a decode worker picked with no overlap credit
========================================  ==============================================

"Uncached" counts against the decode pool's best cached prefix: that is what a local
prefill would compute. A prefill that fails before its hand-off (worker died, refused,
returned none) is retried on another prefill worker, then falls back to local (``auto``)
or fails with 503 (``required``). The frontend never looks inside the hand-off: what a
prefill asks of its engine is the worker's business (``engines.api``).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from dynamoctl.frontend.errors import OpenAIError, overloaded
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.picking import (
    NoWorkerAvailable,
    WorkerChoice,
    WorkerPicker,
    skip_unreachable,
)
from dynamoctl.planes.request import RequestClient, RequestPlaneError
from dynamoctl.settings.frontend import DisaggSettings
from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.records import Endpoint

log = logging.getLogger(__name__)


class Handoff(NamedTuple):
    """A finished remote prefill."""

    params: dict[str, Any]
    """The engine's hand-off, for the decode request."""
    cached_tokens: int
    """Prompt tokens the prefill worker found in its cache (the request's usage)."""


class _PrefillFailed(Exception):
    pass


@dataclass
class Prefiller:
    """Runs the remote prefill of a request, or decides not to (module docstring)."""

    client: RequestClient
    metrics: FrontendMetrics
    settings: DisaggSettings

    def applies(self, pool: WorkerPicker) -> bool:
        """Whether :meth:`prefill` has anything to decide for this pool: not with mode
        ``off``, nor in ``auto`` for a model that has only aggregated workers (the common
        case, kept off the per-request path)."""
        mode = self.settings.disaggregation
        return mode == "required" or (mode == "auto" and pool.disaggregated())

    async def prefill(
        self, request: GenerateRequest, model: str, pool: WorkerPicker
    ) -> Handoff | None:
        """The hand-off of a remote prefill of ``request``, or None: prefill it on the
        decode worker. Raises :class:`OpenAIError` (503) when ``required`` cannot be met."""
        mode, prompt = self.settings.disaggregation, request.token_ids
        if not self.applies(pool):
            return None
        m = self.metrics
        survey = await pool.survey(prompt, request.request_id)
        if not self.applies(pool):  # the survey found out the model is aggregated
            return None
        if survey.prefill_workers == 0:
            if mode == "required":
                raise OpenAIError(
                    503, f"model {model!r} requires disaggregated serving (disaggregation: "
                    "required) but no prefill worker is alive", type="service_unavailable",
                )  # fmt: skip
            m.prefill_fallbacks.labels(model, "no_prefill_worker").inc()
            return None
        if len(prompt) - survey.decode_cached_tokens < self.settings.min_remote_prefill_tokens:
            m.local_prefills.labels(model, "short").inc()
            return None
        exclude: set[str] = set()
        pick_prefill = skip_unreachable(pool.pick_prefill, self.client)
        failure = "no prefill worker left"
        for attempt in range(self.settings.max_prefill_attempts):
            rid = f"{request.request_id}-p{attempt}"
            try:
                choice = await pick_prefill(prompt, rid, exclude)
            except NoWorkerAvailable as exc:
                if exc.busy and mode == "auto":
                    m.local_prefills.labels(model, "saturated").inc()
                    return None
                if exc.busy:
                    raise overloaded(f"every prefill worker is busy: {exc}") from exc
                failure = str(exc)
                break
            try:
                handoff = await self._run(choice, request, rid)
            except _PrefillFailed as exc:
                failure = str(exc)
                exclude.add(choice.worker_id)
                log.warning("request %s: prefill on %s failed: %s", rid, choice.name, exc)
                continue
            finally:
                pool.prefill_finished(rid)
            m.remote_prefills.labels(model).inc()
            return handoff
        if mode == "required":
            raise OpenAIError(
                503, f"remote prefill failed and disaggregation is required: {failure}",
                type="service_unavailable",
            )  # fmt: skip
        m.prefill_fallbacks.labels(model, "prefill_failed").inc()
        return None

    async def _run(self, choice: WorkerChoice, request: GenerateRequest, rid: str) -> Handoff:
        # The same sampling for one token: its KV is what the decode worker continues.
        body = wire_engine.encode(msgspec.structs.replace(
            request, request_id=rid, max_tokens=1, min_tokens=0, logprobs=None,
            kv_transfer_params=None,
        ))  # fmt: skip
        params: dict[str, Any] | None = None
        cached, finish = 0, None
        try:
            stream = self.client.stream(choice.address, Endpoint.GENERATE, body)
            async with contextlib.aclosing(stream):
                async for raw in stream:
                    chunk = wire_engine.decode_chunk(raw)
                    if chunk.cached_tokens is not None:
                        cached = chunk.cached_tokens
                    if chunk.kv_transfer_params is not None:
                        params = chunk.kv_transfer_params
                    finish = chunk.finish_reason or finish
        except RequestPlaneError as exc:
            raise _PrefillFailed(f"{type(exc).__name__}: {exc}") from exc
        if finish is None or finish == "abort":
            raise _PrefillFailed(f"prefill ended with {finish or 'no finish'}")
        if params is None:
            raise _PrefillFailed("the prefill worker returned no KV hand-off")
        return Handoff(params, cached)
