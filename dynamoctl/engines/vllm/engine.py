"""``VllmEngine``: vLLM's ``AsyncLLM`` behind the :class:`Engine` protocol.

* **Arguments**: a recipe's ``engine_args`` go through vLLM's own command-line parser
  (:mod:`dynamoctl.engines.vllm.args`), so they mean what ``vllm serve`` says.
* **Requests**: token ids in (``TokensPrompt``), token ids out (``RequestOutputKind.DELTA``,
  nothing detokenised); the first chunk carries vLLM's ``num_cached_tokens``; a prefill
  worker's ``kv_transfer_params`` ride on the last chunk.
* **Cancel**: :meth:`abort` and a closed stream both abort the request in vLLM (its
  blocks are freed), and the stream ends with ``abort``.
* **KV events**: vLLM's own ZeroMQ publisher, which routers subscribe to directly
  (:class:`PublishesKvEvents`); the sink is never called.
* **Load**: vLLM's scheduler statistics, received through a stat logger.
* **Death**: :meth:`wait_dead` watches vLLM's own verdict (``AsyncLLM.errored``: its
  monitor thread saw the engine core process exit, or its output loop failed) and wakes
  any stream still waiting with ``EngineDeadError``, which the adapter raises as
  :class:`EngineDied`.
* **Drain**: the engine core also receives the group-wide SIGTERM of a drain; unless the
  recipe says otherwise it is told to drain (``shutdown_timeout``) rather than abort, so
  the worker decides when stragglers are aborted.

Start-up runs in a thread: loading weights can take minutes, and the worker's event loop
must keep its discovery lease alive meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn

from dynamoctl.engines.api import (
    AdapterRefused,
    Engine,
    EngineDied,
    EngineError,
    EngineStopped,
    GenerateChunk,
    GenerateRequest,
    KVEventSink,
    KvEventSource,
    LoadMetrics,
    ModelCard,
    PublishesKvEvents,
    ReportsDeath,
    RequestRejected,
    ServesAdapters,
)
from dynamoctl.engines.common import poll_death
from dynamoctl.engines.vllm import args as vargs
from dynamoctl.engines.vllm import cpu_build, gang, lmcache, pooling, vision
from dynamoctl.engines.vllm.load import LoadTracker
from dynamoctl.structured.engines import vllm_fields
from dynamoctl.wire.engine import Pooling
from dynamoctl.wire.ids import as_list, packed

cpu_build.pin_platform()  # before vLLM resolves its platform (the imports below do)
try:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.exceptions import VLLMClientError
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.metrics.loggers import StatLoggerBase
except RuntimeError as exc:  # e.g. CUDA builds of torchvision next to a CPU torch
    raise ImportError(
        f"vllm is installed but does not import ({exc}); on CPU, uninstall torchvision "
        "torchaudio torchcodec (see docs/engines.md)"
    ) from exc

log = logging.getLogger(__name__)

DRAIN_SHUTDOWN_TIMEOUT = 3600
"""``shutdown_timeout`` given to vLLM unless the recipe sets one: on SIGTERM its engine
core keeps serving in-flight requests until they end; the worker aborts stragglers."""


class _Parser(FlexibleArgumentParser):  # type: ignore[misc]
    """vLLM's parser, raising instead of exiting: a bad argument is a start-up error."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"vllm engine arguments: {message}")


class _LoadLogger(StatLoggerBase):  # type: ignore[misc]
    """Receives vLLM's per-step scheduler statistics (a custom stat logger)."""

    def __init__(self, tracker: LoadTracker) -> None:
        self.tracker = tracker

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.tracker.on_scheduler_stats(
                scheduler_stats.num_running_reqs, scheduler_stats.kv_cache_usage
            )

    def log_engine_initialized(self) -> None:
        pass


class VllmEngine(Engine, PublishesKvEvents, ReportsDeath, ServesAdapters):
    """vLLM in the worker process (registered as ``vllm``); see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        options = vargs.with_kv_events(options)
        options.setdefault("shutdown_timeout", DRAIN_SHUTDOWN_TIMEOUT)
        self._lmcache = _lmcache_server(options)  # the CPU build's host KV tier, if asked
        parser = AsyncEngineArgs.add_cli_args(_Parser(prog="dynamoctl worker --engine vllm"))
        self.engine_args = AsyncEngineArgs.from_cli_args(
            parser.parse_args(vargs.engine_argv(options))
        )
        # A multi-node replica's leader (dynamoctl set its local DP size) fronts every DP
        # rank of its gang with one AsyncLLM (docs/engines.md, "Multi-node replicas").
        gang_leader = options.get("data_parallel_size_local") is not None
        if self.engine_args.data_parallel_size > 1 and not gang_leader:
            raise ValueError(
                "vllm engine arguments: data-parallel-size > 1 is not supported in one "
                "worker; run one worker replica per data-parallel rank"
            )
        self._gang = gang.is_gang(options)
        self._host = "127.0.0.1"
        self._engine: Any = None  # AsyncLLM once started
        self._load = LoadTracker()
        self._defaults: dict[str, Any] = {}
        self._kv_source: KvEventSource | None = None
        self._vision: vision.VisionModel | None = None
        self._adapters: dict[str, Any] = {}  # name -> LoRARequest
        self._lora_ids = 0
        args = self.engine_args
        name = args.served_model_name
        self._card = ModelCard(  # provisional: vLLM's config fills it in at start()
            model=(name[0] if isinstance(name, list) else name) or args.model,
            tokenizer=args.tokenizer or args.model,
            block_size=args.block_size or 0,
            kv_capacity_blocks=0,
            max_num_seqs=args.max_num_seqs or 0,
            max_num_batched_tokens=args.max_num_batched_tokens or 0,
            context_length=args.max_model_len or 0,
        )

    @classmethod
    def from_options(cls, **options: Any) -> VllmEngine:
        """Registry factory: ``options`` are vLLM engine arguments (``max_num_seqs=8``)."""
        return cls(options)

    # ------------------------------------------------------------------ Engine protocol

    @property
    def model_card(self) -> ModelCard:
        return self._card

    def set_kv_event_host(self, host: str) -> None:
        self._host = host

    def kv_event_source(self) -> KvEventSource | None:
        return self._kv_source

    async def start(self) -> None:
        if self._engine is not None:
            return
        ip = vargs.bind_ip(self._host)
        if ip is not None:  # where vLLM binds what it binds on "this node" (tcp://*:0)
            os.environ.setdefault("VLLM_HOST_IP", ip)
        if self._gang:  # gloo's ranks meet on the gang's network (docs/engines.md)
            gang.set_network_env()
        began = time.monotonic()
        if self._lmcache is not None:
            os.environ.update(lmcache.ENV)
            await self._lmcache.start()
        try:
            self._engine = engine = await asyncio.to_thread(
                AsyncLLM.from_engine_args,
                self.engine_args,
                stat_loggers=[lambda _config, _index: _LoadLogger(self._load)],
            )
        except BaseException:
            if self._lmcache is not None:
                await self._lmcache.stop()
            raise
        config = engine.vllm_config
        self._vision = vision.vision_model(config)
        self._card = card = _model_card(config, self._vision)
        self._load.total_blocks = card.kv_capacity_blocks
        self._defaults = dict(config.model_config.get_diff_sampling_param())
        self._kv_source = self._find_kv_source(engine)
        if self._kv_source is not None and self._lmcache is not None:
            # LMCache reports what enters its CPU tier, never what leaves it.
            capacity = int(self._lmcache.l1_bytes // _kv_bytes_per_block(config))
            self._kv_source = dataclasses.replace(self._kv_source, silent_tiers={"CPU": capacity})
        # One token end to end: the engine computes, and its output loop runs, before the
        # worker registers as ready.
        warmup = GenerateRequest(f"dynamoctl-warmup-{os.getpid()}", packed([0]), 1, ignore_eos=True)
        if card.embedding is not None:  # an embedding model: its pooler, end to end
            warmup.pooling = Pooling()
        async for _ in self.generate(warmup):
            pass
        log.info(
            "vLLM ready in %.1fs on %s: %s, %d KV blocks of %d tokens, KV events on %s",
            time.monotonic() - began,
            type(current_platform).__name__,
            card.model,
            card.kv_capacity_blocks,
            card.block_size,
            self._kv_source.address if self._kv_source else "none",
        )

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        live = self._load.live
        if live:  # their streams receive vLLM's final "abort" outputs
            await engine.abort(live)
        try:
            await asyncio.to_thread(engine.shutdown)
        finally:
            if self._lmcache is not None:
                await self._lmcache.stop()

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        return self._stream(request)

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    def remote_prefill_params(self) -> Mapping[str, Any]:
        """Disaggregation (PrefillsForRemoteDecode): NIXL's ask for a prefill whose KV a
        remote decode pulls; the last chunk returns vLLM's ``kv_transfer_params``."""
        return {"do_remote_decode": True, "do_remote_prefill": False}

    def set_kv_event_sink(self, sink: KVEventSink | None) -> None:
        """Unused: vLLM publishes its KV events itself (see :meth:`kv_event_source`)."""

    def load_metrics(self) -> LoadMetrics:
        engine = self._engine
        return self._load.metrics(engine.get_num_unfinished_requests() if engine else 0)

    async def wait_dead(self) -> EngineDied:
        def cause() -> str | None:  # vLLM's monitor thread sets the flag
            engine = self._engine
            if engine is None or not engine.errored:
                return None
            # vLLM's output loop normally fails every stream; make sure none keeps waiting.
            with contextlib.suppress(Exception):
                engine.output_processor.propagate_error(EngineDeadError())
            return _death_cause(engine)

        return await poll_death(cause)

    # ------------------------------------------------------------------ LoRA adapters

    def serves_adapters(self) -> bool:
        return bool(self.engine_args.enable_lora)

    async def load_adapter(self, name: str, path: str) -> None:
        if self._engine is None:
            raise EngineStopped("vLLM engine is not running")
        if name in self._adapters:
            return
        self._lora_ids += 1
        lora = LoRARequest(name, self._lora_ids, path)
        try:  # vLLM reads and checks the adapter (rank, modules) as it adds it
            added = await self._engine.add_lora(lora)
        except (ValueError, RuntimeError, OSError) as exc:
            raise AdapterRefused(f"adapter {name!r}: vLLM refused it: {exc}") from exc
        if not added:
            raise AdapterRefused(f"adapter {name!r}: vLLM did not add it")
        self._adapters[name] = lora

    async def unload_adapter(self, name: str) -> None:
        lora = self._adapters.pop(name, None)
        if lora is not None and self._engine is not None:
            await self._engine.remove_lora(lora.lora_int_id)

    # ------------------------------------------------------------------ internals

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        engine = self._engine
        if engine is None:
            raise EngineStopped("vLLM engine is not running")
        rid = request.request_id
        if request.pooling is not None or self._card.embedding is not None:
            async for chunk in self._pooled(engine, request):
                yield chunk
            return
        try:
            kwargs = vargs.sampling_kwargs(request, self._defaults)
            if request.output is not None and request.output.constraint is not None:
                kwargs["structured_outputs"] = StructuredOutputsParams(
                    **vllm_fields(request.output.constraint)
                )  # guided decoding: dynamoctl.structured
            params = SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
        except (ValueError, VLLMClientError) as exc:
            raise RequestRejected(str(exc)) from exc
        try:
            prompt = (
                TokensPrompt(**vision.prompt_fields(request, self._vision))
                if request.images
                else TokensPrompt(prompt_token_ids=as_list(request.token_ids))
            )
        except Exception as exc:  # Pillow: the frontend checked it, a peer may not have
            raise RequestRejected(f"images: {exc}") from exc
        lora = None
        if request.adapter is not None:
            lora = self._adapters.get(request.adapter)
            if lora is None:
                raise RequestRejected(f"LoRA adapter {request.adapter!r} is not loaded here")
        # The worker's span as parent of vLLM's own (its --otlp-traces-endpoint, spec.py).
        traced = {"traceparent": request.trace_context} if request.trace_context else None
        self._load.started(rid, len(request.token_ids))
        first = True
        scored = 0  # prompt tokens whose log-probabilities were sent (prompt_logprobs)
        try:
            stream = engine.generate(
                prompt, params, rid, lora_request=lora, trace_headers=traced,
                priority=vargs.vllm_priority(request.priority),
            )  # fmt: skip
            async with contextlib.aclosing(stream) as outputs:
                async for out in outputs:
                    completion = out.outputs[0]
                    chunk = GenerateChunk(list(completion.token_ids))
                    if request.prompt_logprobs is not None and out.prompt_logprobs:
                        ids = request.token_ids[scored : scored + len(out.prompt_logprobs)]
                        scored += len(ids)
                        chunk.prompt_logprobs = vargs.prompt_token_logprobs(
                            ids, out.prompt_logprobs, request.prompt_logprobs
                        )
                    if request.logprobs is not None:
                        chunk.logprobs = vargs.token_logprobs(
                            chunk.token_ids, completion.logprobs or [], request.logprobs
                        )
                    if first:
                        first = False
                        chunk.cached_tokens = out.num_cached_tokens or 0
                        chunk.prompt_tokens = len(request.token_ids)
                        self._load.prefilled(rid)
                    if out.finished:
                        chunk.finish_reason = vargs.finish_reason(completion.finish_reason)
                        chunk.kv_transfer_params = out.kv_transfer_params
                    yield chunk
        except EngineDeadError as exc:
            raise EngineDied(_death_cause(engine)) from exc
        except (ValueError, VLLMClientError) as exc:  # vLLM refused the request as given
            raise RequestRejected(str(exc)) from exc
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM failed request {rid}: {exc!r}") from exc
        finally:
            self._load.finished(rid)

    async def _pooled(self, engine: Any, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """An embedding request (:mod:`.pooling`), its failures as a generation's."""
        if self._card.embedding is None:
            raise RequestRejected("this worker runs a generative model; it embeds nothing")
        try:
            async for chunk in pooling.embed(engine, request, self._load):
                yield chunk
        except EngineDeadError as exc:
            raise EngineDied(_death_cause(engine)) from exc
        except (ValueError, VLLMClientError) as exc:  # vLLM refused it (dimensions...)
            raise RequestRejected(str(exc)) from exc

    def _find_kv_source(self, engine: Any) -> KvEventSource | None:
        sources = engine.get_kv_event_sources()
        configured = self.engine_args.kv_events_config
        if not sources or configured is None:
            return None
        reported = sources[min(sources)]
        source = vargs.kv_event_source(
            configured.endpoint,
            reported.endpoint,
            reported.replay_endpoint,
            reported.topic,
            self._host,
        )
        if source is None:
            log.warning(
                "vLLM sends its KV events to %s (it connects there): routers cannot"
                " subscribe; bind an endpoint instead (tcp://*:PORT or tcp://*:0)",
                configured.endpoint,
            )
        return source


def _lmcache_server(options: dict[str, Any]) -> lmcache.LMCacheServer | None:
    """``lmcache_l1_gib`` and ``lmcache_disk_path`` (ours, from a recipe's ``kv_offload``
    on the CPU build): an LMCache server of that size, with a disk tier there if given,
    and vLLM's connector to it in ``options``."""
    l1_gib = options.pop("lmcache_l1_gib", None)
    disk_path = options.pop("lmcache_disk_path", None)
    if l1_gib is None:
        if disk_path is not None:
            raise ValueError("vllm engine arguments: lmcache-disk-path needs lmcache-l1-gib")
        return None
    if "kv_transfer_config" in options:
        raise ValueError(
            "vllm engine arguments: kv_offload with LMCache sets kv-transfer-config; "
            "remove the recipe's own"
        )
    chunk = int(options.get("block_size") or 16)
    disk = None if disk_path is None else str(disk_path)
    server = lmcache.LMCacheServer(float(l1_gib), chunk, disk_path=disk)
    options["kv_transfer_config"] = server.kv_transfer_config()
    return server


def _kv_bytes_per_block(config: Any) -> int:
    """KV bytes of one block: K and V of every layer for ``block_size`` tokens."""
    model, parallel = config.model_config, config.parallel_config
    per_token = (
        2
        * model.get_num_layers(parallel)
        * model.get_num_kv_heads(parallel)
        * model.get_head_size()
        * model.dtype.itemsize
    )
    return max(1, int(per_token * config.cache_config.block_size))


def _death_cause(engine: Any) -> str:
    """Which engine core process exited and how, when vLLM knows (multiprocessing mode)."""
    manager = getattr(engine.engine_core.resources, "engine_manager", None)
    try:
        finished = manager.finished_procs() if manager is not None else {}
    except Exception:  # internals of vLLM's process manager: best effort only
        finished = {}
    if finished:
        return "vLLM engine core died: " + ", ".join(
            f"{name} exited with code {code}" for name, code in sorted(finished.items())
        )
    return "vLLM engine core died (its output loop failed)"


def _model_card(config: Any, seen: vision.VisionModel | None) -> ModelCard:
    """The card from vLLM's resolved configuration (after start: KV blocks are known)."""
    model, cache, scheduler = config.model_config, config.cache_config, config.scheduler_config
    name = model.served_model_name
    return ModelCard(
        model=name[0] if isinstance(name, list) else name,
        tokenizer=model.tokenizer,
        block_size=cache.block_size,
        kv_capacity_blocks=cache.num_gpu_blocks or 0,
        max_num_seqs=scheduler.max_num_seqs,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        context_length=model.max_model_len,
        embedding=pooling.embedding_traits(config),
        vision=seen.traits if seen is not None else None,
    )
