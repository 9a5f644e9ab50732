"""``SglangEngine``: SGLang's offline ``Engine`` behind the :class:`Engine` protocol.

Unverified against a running SGLang (see the package docstring). What it relies on, from
SGLang 0.5: ``sglang.Engine(**server_args)``; ``async_generate(input_ids=...,
sampling_params=..., stream=True, rid=..., bootstrap_host/port/room=...)`` yielding dicts
with ``output_ids`` and ``meta_info`` (``finish_reason``, ``cached_tokens``);
``tokenizer_manager.abort_request(rid)``; ``get_server_info()``; ``shutdown()``; and the
``--kv-events-config`` ZeroMQ publisher, which speaks vLLM's format and which routers
subscribe to directly. Load is estimated from the adapter's own requests.

Death: SGLang's processes send SIGQUIT to the process that started them when they fail,
and SGLang's own handler then kills the whole process tree, worker included, with no
chance to fail requests or deregister. Once started, the adapter takes SIGQUIT over and
reports it as :class:`EngineDied`, as it does the exit of any process SGLang started
(:class:`ChildWatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import AsyncIterator, Mapping
from typing import Any

import sglang

from dynamoctl.engines.api import (
    Engine,
    EngineDied,
    EngineStopped,
    GenerateChunk,
    GenerateRequest,
    KVEventSink,
    KvEventSource,
    LoadMetrics,
    ModelCard,
    PublishesKvEvents,
    ReportsDeath,
)
from dynamoctl.engines.common import ChildWatch, RequestLoad, free_port, poll_death
from dynamoctl.engines.sglang import args as sargs
from dynamoctl.engines.sglang import gang as sgang
from dynamoctl.wire.ids import as_list


class SglangEngine(Engine, PublishesKvEvents, ReportsDeath):
    """SGLang in the worker process (registered as ``sglang``)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        sargs.server_args(self.options, None)  # refuse bad arguments before start()
        self._host = "127.0.0.1"
        self._engine: Any = None
        self._args: dict[str, Any] = {}
        self._load = RequestLoad()
        self._children: ChildWatch | None = None
        self._quit: str | None = None  # set by the SIGQUIT handler
        self._card = ModelCard(
            model=str(options.get("served_model_name") or options.get("model") or "sglang"),
            tokenizer=str(options.get("tokenizer") or options.get("model") or ""),
            block_size=0,
            kv_capacity_blocks=0,
            max_num_seqs=0,
            max_num_batched_tokens=0,
            context_length=0,
        )

    @classmethod
    def from_options(cls, **options: Any) -> SglangEngine:
        return cls(options)

    @property
    def model_card(self) -> ModelCard:
        return self._card

    def set_kv_event_host(self, host: str) -> None:
        self._host = host

    def kv_event_source(self) -> KvEventSource | None:
        config = sargs.kv_events(self._args)
        endpoint = str(config.get("endpoint", "")) if config is not None else ""
        if config is None or not ("*" in endpoint or endpoint.startswith("ipc://")):
            return None  # SGLang connects to any other endpoint: nobody can subscribe
        name = f"[{self._host}]" if ":" in self._host else self._host
        replay = config.get("replay_endpoint")
        return KvEventSource(
            str(config["endpoint"]).replace("*", name),
            str(replay).replace("*", name) if replay else None,
            str(config.get("topic", "")),
        )

    async def start(self) -> None:
        if self._engine is not None:
            return
        ports = (free_port(self._host), free_port(self._host))
        self._args = sargs.server_args(self.options, (f"tcp://*:{ports[0]}", f"tcp://*:{ports[1]}"))
        if sgang.is_gang(self.options):  # gloo/NCCL ranks meet on the gang's network
            sgang.set_network_env()
        children = ChildWatch("SGLang")
        self._engine = await asyncio.to_thread(sglang.Engine, **self._args)
        children.started()
        self._children = children
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, self._on_sigquit)
        info = self._engine.get_server_info()
        self._card = sargs.model_card(info, self.options.get("served_model_name"))
        self._load = RequestLoad(self._card.block_size, self._card.kv_capacity_blocks)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGQUIT)
            for rid in self._load.live:
                engine.tokenizer_manager.abort_request(rid=rid)
            await asyncio.to_thread(engine.shutdown)

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        return self._stream(request)

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.tokenizer_manager.abort_request(rid=request_id)

    def remote_prefill_params(self) -> Mapping[str, Any] | None:
        """Disaggregation (PrefillsForRemoteDecode): nothing to ask; an engine started
        with ``disaggregation-mode: prefill`` makes the bootstrap room itself (above)."""
        return None

    def set_kv_event_sink(self, sink: KVEventSink | None) -> None:
        """Unused: SGLang publishes its KV events itself."""

    def load_metrics(self) -> LoadMetrics:
        return self._load.metrics()

    async def wait_dead(self) -> EngineDied:
        def cause() -> str | None:
            if self._engine is None or self._children is None:  # not started, or stopped
                return None
            return self._quit or self._children.gone()

        return await poll_death(cause)

    def _on_sigquit(self) -> None:
        self._quit = "an SGLang process reported a failure (SIGQUIT)"

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        engine = self._engine
        if engine is None:
            raise EngineStopped("SGLang engine is not running")
        rid, params = request.request_id, sargs.sampling_params(request)
        bootstrap = sargs.bootstrap_kwargs(request.kv_transfer_params)
        handoff = None
        if self._args.get("disaggregation_mode") == "prefill" and "bootstrap_room" not in bootstrap:
            room = random.getrandbits(63)  # the decode worker joins the same room
            bootstrap = {"bootstrap_room": room}
            port = int(self._args.get("disaggregation_bootstrap_port", 8998))
            handoff = sargs.bootstrap_info(self._host, port, room)
        incremental = bool(self._args.get("stream_output"))
        self._load.started(rid, len(request.token_ids))
        seen, first = 0, True
        try:
            outputs = await engine.async_generate(
                input_ids=as_list(request.token_ids), sampling_params=params, stream=True, rid=rid,
                **sargs.logprob_kwargs(request), **bootstrap,
                **sargs.priority_kwargs(request, self._args),
            )  # fmt: skip
            async for out in outputs:
                meta = out.get("meta_info", {})
                tokens = sargs.new_tokens(out.get("output_ids", []), seen, incremental)
                seen += len(tokens)
                self._load.produced(rid, len(tokens))
                chunk = GenerateChunk(tokens, sargs.finish_reason(meta))
                if request.logprobs is not None:
                    chunk.logprobs = sargs.token_logprobs(meta, seen - len(tokens), len(tokens))
                if first:
                    first = False
                    chunk.cached_tokens = int(meta.get("cached_tokens") or 0)
                    chunk.prompt_tokens = len(request.token_ids)
                    chunk.kv_transfer_params = handoff
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            self._load.finished(rid)
