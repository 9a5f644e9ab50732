"""``TrtllmEngine``: TensorRT-LLM's ``LLM`` API behind the :class:`Engine` protocol.

Unverified against a running TensorRT-LLM (see the package docstring). What it relies on,
from TensorRT-LLM 1.x: ``LLM(**kwargs)`` with ``kv_cache_config``; ``generate_async(
token_ids, sampling_params, streaming=True, disaggregated_params=...)`` returning a
result to iterate (``outputs[0].token_ids_diff``, ``finish_reason``,
``disaggregated_params``) and ``abort()``; ``get_kv_cache_events_async(timeout)`` and
``get_stats_async(timeout)`` (``kvCacheStats.maxNumBlocks``); ``shutdown()``.

Unlike vLLM and SGLang, TensorRT-LLM hands its KV events to the process, so they go to the
sink and the worker publishes them (with snapshots for late routers), as for the mocker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.llmapi import DisaggregatedParams, KvCacheConfig
from tensorrt_llm.sampling_params import GuidedDecodingParams

from dynamoctl.engines.api import (
    Engine,
    EngineStopped,
    GenerateChunk,
    GenerateRequest,
    KVEventSink,
    LoadMetrics,
    ModelCard,
)
from dynamoctl.engines.common import RequestLoad
from dynamoctl.engines.trtllm import args as targs
from dynamoctl.engines.trtllm.events import convert_events
from dynamoctl.structured.engines import trtllm_fields
from dynamoctl.wire.ids import as_list, packed

log = logging.getLogger(__name__)


class TrtllmEngine(Engine):
    """TensorRT-LLM in the worker process (registered as ``trtllm``)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        self.kwargs = targs.llm_kwargs(options)
        self._llm: Any = None
        self._results: dict[str, Any] = {}
        self._sink: KVEventSink | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._load = RequestLoad()
        self._card = targs.model_card(options, self.kwargs, None, 0)

    @classmethod
    def from_options(cls, **options: Any) -> TrtllmEngine:
        return cls(options)

    @property
    def model_card(self) -> ModelCard:
        return self._card

    async def start(self) -> None:
        if self._llm is not None:
            return
        kwargs = dict(self.kwargs, kv_cache_config=KvCacheConfig(**self.kwargs["kv_cache_config"]))
        self._llm = llm = await asyncio.to_thread(LLM, **kwargs)
        self._card = targs.model_card(self.options, self.kwargs, llm.args, 0)
        self._tasks = [
            asyncio.create_task(self._follow_events(), name="trtllm-kv-events"),
            asyncio.create_task(self._follow_stats(), name="trtllm-stats"),
        ]
        warmup = GenerateRequest("dynamoctl-warmup", packed([0]), 1, ignore_eos=True)
        async for _ in self.generate(warmup):
            pass
        for _ in range(50):  # the first statistics name the KV capacity
            if self._load.total_blocks:
                break
            await asyncio.sleep(0.1)
        self._card = targs.model_card(self.options, self.kwargs, llm.args, self._load.total_blocks)
        self._load.block_size = self._card.block_size

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        for result in self._results.values():
            result.abort()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(llm.shutdown)

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        return self._stream(request)

    async def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None:
            result.abort()

    def remote_prefill_params(self) -> Mapping[str, Any]:
        """Disaggregation (PrefillsForRemoteDecode): a context-only request; its
        ``disaggregated_params`` come back on the last chunk."""
        return {"request_type": "context_only"}

    def set_kv_event_sink(self, sink: KVEventSink | None) -> None:
        self._sink = sink

    def load_metrics(self) -> LoadMetrics:
        return self._load.metrics()

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        llm = self._llm
        if llm is None:
            raise EngineStopped("TensorRT-LLM engine is not running")
        rid = request.request_id
        sampling = SamplingParams(
            **targs.sampling_kwargs(request),
            guided_decoding=guided_decoding(request),  # dynamoctl.structured
        )
        disagg = None
        if request.kv_transfer_params is not None:
            disagg = DisaggregatedParams(**targs.disagg_to_params(request.kv_transfer_params))
        result = llm.generate_async(
            as_list(request.token_ids), sampling_params=sampling, streaming=True,
            disaggregated_params=disagg,
        )  # fmt: skip
        self._results[rid] = result
        self._load.started(rid, len(request.token_ids))
        first = True
        try:
            async for out in result:
                completion = out.outputs[0]
                tokens = list(completion.token_ids_diff)
                self._load.produced(rid, len(tokens))
                chunk = GenerateChunk(tokens)
                if request.logprobs is not None:
                    chunk.logprobs = targs.token_logprobs(completion, len(tokens))
                if first:
                    first = False
                    chunk.prompt_tokens = len(request.token_ids)
                    chunk.cached_tokens = _cached_tokens(completion, self._card.block_size)
                if out.finished:
                    chunk.finish_reason = targs.finish_reason(completion.finish_reason)
                    chunk.kv_transfer_params = targs.params_to_disagg(
                        completion.disaggregated_params
                    )
                yield chunk
        finally:
            self._results.pop(rid, None)
            self._load.finished(rid)

    async def _follow_events(self) -> None:
        while self._llm is not None:
            events = [e async for e in self._llm.get_kv_cache_events_async(timeout=1)]
            batch = convert_events(events, self._card.block_size or 32)
            if batch is not None and self._sink is not None:
                self._sink(batch)
            if not events:
                await asyncio.sleep(0.05)

    async def _follow_stats(self) -> None:
        while self._llm is not None:
            async for stats in self._llm.get_stats_async(timeout=2):
                cache = stats.get("kvCacheStats", {}) if isinstance(stats, dict) else {}
                if cache.get("maxNumBlocks"):
                    self._load.total_blocks = int(cache["maxNumBlocks"])
            await asyncio.sleep(0.5)


def _cached_tokens(completion: Any, block_size: int) -> int:
    """Prompt tokens reused from the cache, when TensorRT-LLM reports them (perf metrics)."""
    metrics = getattr(completion, "request_perf_metrics", None)
    kv = getattr(metrics, "kv_cache_metrics", None)
    return int(getattr(kv, "num_reused_blocks", 0) or 0) * block_size


def guided_decoding(request: GenerateRequest) -> GuidedDecodingParams | None:
    """The request's output constraint (:mod:`dynamoctl.structured`); the LLM must have
    been built with a ``guided_decoding_backend`` (docs/engines.md)."""
    if request.output is None or request.output.constraint is None:
        return None
    return GuidedDecodingParams(**trtllm_fields(request.output.constraint))
