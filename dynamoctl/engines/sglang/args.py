"""SGLang's side of the adapter that needs no SGLang: server arguments, KV-event config,
streamed outputs, finish reasons, model card and bootstrap info, as plain data."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dynamoctl.engines.api import EngineError, FinishReason, GenerateRequest, ModelCard
from dynamoctl.engines.common import translate
from dynamoctl.structured.engines import sglang_params
from dynamoctl.wire.engine import TokenLogprobs

ALIASES: Final[Mapping[str, str]] = {
    "model": "model_path",
    "tokenizer": "tokenizer_path",
    "block_size": "page_size",
    "max_model_len": "context_length",
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "chunked_prefill_size",
    # SGLang's command line takes these spellings of its parallel sizes (and the recipe's
    # gang rules accept them); its ServerArgs, what sglang.Engine is built from, only
    # the *_size fields.
    "tp": "tp_size",
    "tensor_parallel_size": "tp_size",
    "pp": "pp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
}
"""dynamoctl's (vLLM's) argument names → SGLang's ``ServerArgs`` fields."""

FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
}

BOOTSTRAP_KEYS: Final = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
"""SGLang's disaggregation hand-off: which prefill server, and the room both sides meet in."""


def server_args(options: Mapping[str, Any], kv_endpoints: tuple[str, str] | None) -> dict[str, Any]:
    """``sglang.Engine`` keywords: ``options`` with dynamoctl's names translated, token ids
    in and out (``skip_tokenizer_init``), and a ZeroMQ KV-event publisher bound on
    ``kv_endpoints`` (PUB, replay) unless the recipe configures one or turns the radix
    cache off. SGLang takes ``kv_events_config`` as a JSON string."""
    args = translate(options, ALIASES, "sglang")
    if args.get("skip_tokenizer_init") is False:
        raise ValueError("sglang engine arguments: the worker needs skip-tokenizer-init")
    args["skip_tokenizer_init"] = True
    config = args.get("kv_events_config")
    if config is None and kv_endpoints is not None and not args.get("disable_radix_cache"):
        pub, replay = kv_endpoints
        config = {"publisher": "zmq", "endpoint": pub, "replay_endpoint": replay}
    if config is not None:
        args["kv_events_config"] = config if isinstance(config, str) else json.dumps(config)
    return args


def kv_events(args: Mapping[str, Any]) -> dict[str, Any] | None:
    """The KV-event config SGLang will use (parsed), or None when it publishes none."""
    raw = args.get("kv_events_config")
    config = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(config, dict) or config.get("publisher", "null") == "null":
        return None
    return config


def new_tokens(output_ids: Sequence[int], seen: int, incremental: bool) -> list[int]:
    """The tokens of a streamed output not returned before: SGLang streams only the new
    ones with ``stream_output`` (incremental), else all so far."""
    return list(output_ids) if incremental else list(output_ids[seen:])


def finish_reason(meta_info: Mapping[str, Any]) -> FinishReason | None:
    """Ours from SGLang's ``meta_info["finish_reason"]`` (``{"type": "stop", ...}`` or
    None while running); an engine-side error raises."""
    reason = meta_info.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if isinstance(kind, str) and kind in FINISH_REASONS:
        return FINISH_REASONS[kind]
    raise EngineError(f"SGLang ended the request with {reason!r}")


def model_card(info: Mapping[str, Any], served_name: str | None) -> ModelCard:
    """The card from ``Engine.get_server_info()`` (server arguments plus the scheduler's
    ``max_total_num_tokens``)."""
    page = int(info.get("page_size") or 1)
    return ModelCard(
        model=served_name or str(info.get("served_model_name") or info["model_path"]),
        tokenizer=str(info.get("tokenizer_path") or info["model_path"]),
        block_size=page,
        kv_capacity_blocks=int(info.get("max_total_num_tokens") or 0) // page,
        max_num_seqs=int(info.get("max_running_requests") or 0),
        max_num_batched_tokens=int(info.get("chunked_prefill_size") or 0),
        context_length=int(info.get("context_length") or info.get("max_req_input_len") or 0),
    )


def bootstrap_kwargs(kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``async_generate`` keywords from a request's hand-off (decode side, or a prefill
    told its room)."""
    params = kv_transfer_params or {}
    return {key: params[key] for key in BOOTSTRAP_KEYS if params.get(key) is not None}


def bootstrap_info(host: str, port: int, room: int) -> dict[str, Any]:
    """What a prefill worker hands on (its first chunk) for the decode worker's request."""
    return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}


SAMPLING_NAMES: Final = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty", "seed": "sampling_seed",
}  # fmt: skip
"""Our request's sampling fields → SGLang's ``sampling_params`` keys."""


def sampling_params(request: GenerateRequest) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for ``request`` (None fields: SGLang's defaults).
    ``ignore_eos`` drops the end-of-sequence ids, never the client's stop ids."""
    params: dict[str, Any] = {"max_new_tokens": request.max_tokens}
    stops = list(request.user_stop_token_ids)
    if request.ignore_eos:
        params["ignore_eos"] = True
    else:
        stops += request.stop_token_ids
    if stops:
        params["stop_token_ids"] = list(dict.fromkeys(stops))
    for ours, theirs in SAMPLING_NAMES.items():
        value = getattr(request, ours)
        if value is not None:
            params[theirs] = value
    if request.top_k is not None and request.top_k <= 0:
        params["top_k"] = -1  # SGLang's "off"
    if request.min_tokens:
        params["min_new_tokens"] = request.min_tokens
    if request.logit_bias:
        params["logit_bias"] = {str(k): v for k, v in request.logit_bias.items()}
    if request.output is not None and request.output.constraint is not None:
        params.update(sglang_params(request.output.constraint))  # dynamoctl.structured
    return params


def priority_kwargs(request: GenerateRequest, args: Mapping[str, Any]) -> dict[str, Any]:
    """The request's priority for an engine started with ``enable_priority_scheduling``
    (SGLang admits higher values first, as dynamoctl, unless told
    ``schedule_low_priority_values_first``); nothing otherwise (SGLang refuses a priority
    it does not schedule by when told ``abort_on_priority_when_disabled``)."""
    if not args.get("enable_priority_scheduling"):
        return {}
    low_first = bool(args.get("schedule_low_priority_values_first"))
    return {"priority": -request.priority if low_first else request.priority}


def logprob_kwargs(request: GenerateRequest) -> dict[str, Any]:
    """``async_generate`` keywords asking for output log-probabilities."""
    if request.logprobs is None:
        return {}
    return {"return_logprob": True, "top_logprobs_num": request.logprobs}


def token_logprobs(meta_info: Mapping[str, Any], start: int, count: int) -> list[TokenLogprobs]:
    """Ours for output tokens ``start .. start + count`` from SGLang's ``meta_info``:
    ``output_token_logprobs`` entries ``(logprob, token_id, text)``, and
    ``output_top_logprobs`` a list of such entries per token."""
    sampled = list(meta_info.get("output_token_logprobs") or [])
    tops = list(meta_info.get("output_top_logprobs") or [])
    if len(sampled) < start + count:  # incremental output: only this chunk's tokens
        start = max(0, len(sampled) - count)
    entries = []
    for i in range(start, start + count):
        logprob = sampled[i][0] if i < len(sampled) else None
        top = (tops[i] if i < len(tops) else None) or []
        entries.append(
            TokenLogprobs(
                logprob=float(logprob) if logprob is not None else -9999.0,
                top_ids=[int(t[1]) for t in top],
                top_logprobs=[float(t[0]) for t in top],
            )
        )
    return entries
