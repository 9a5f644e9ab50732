"""TensorRT-LLM's side of the adapter that needs no TensorRT-LLM: ``LLM`` keywords, model
card, finish reasons and disaggregated parameters, as plain data."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final

from dynamoctl.engines.api import EngineError, FinishReason, GenerateRequest, ModelCard
from dynamoctl.engines.common import translate
from dynamoctl.wire.engine import TokenLogprobs

ALIASES: Final[Mapping[str, str]] = {
    "max_model_len": "max_seq_len",
    "max_num_seqs": "max_batch_size",
    "max_num_batched_tokens": "max_num_tokens",
    # trtllm-serve's spellings of the parallel sizes (the gang rules accept them too).
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
}
"""dynamoctl's (vLLM's) argument names → ``LLM`` keywords (``model`` and ``tokenizer``
are the same); ``block_size`` and ``enable_prefix_caching`` go into ``kv_cache_config``."""

OURS: Final = ("served_model_name",)
"""Arguments the adapter itself uses, not passed to ``LLM``."""

EVENT_BUFFER: Final = 1024
"""``kv_cache_config.event_buffer_max_size`` unless the recipe sets one: without a buffer
TensorRT-LLM produces no KV-cache events."""

FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "abort",
    "abort": "abort",
}


def llm_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``tensorrt_llm.LLM`` keywords for the recipe's arguments."""
    kwargs = translate({k: v for k, v in options.items() if k not in OURS}, ALIASES, "trtllm")
    cache = dict(kwargs.pop("kv_cache_config", None) or {})
    for ours, theirs in (
        ("block_size", "tokens_per_block"),
        ("enable_prefix_caching", "enable_block_reuse"),
    ):
        if ours in kwargs:
            value = kwargs.pop(ours)
            if theirs in cache and cache[theirs] != value:
                raise ValueError(
                    f"trtllm engine arguments: --{ours.replace('_', '-')} {value!r} and "
                    f"kv-cache-config.{theirs} {cache[theirs]!r} set the same thing"
                )
            cache[theirs] = value
    if cache.get("enable_block_reuse", True):
        cache.setdefault("event_buffer_max_size", EVENT_BUFFER)
    kwargs["kv_cache_config"] = cache
    return kwargs


def model_card(
    options: Mapping[str, Any], kwargs: Mapping[str, Any], llm_args: Any, blocks: int
) -> ModelCard:
    """The card from the ``LLM``'s resolved arguments (``llm.args``) and the KV blocks its
    first statistics reported."""
    cache = kwargs.get("kv_cache_config", {})
    return ModelCard(
        model=str(options.get("served_model_name") or kwargs["model"]),
        tokenizer=str(kwargs.get("tokenizer") or kwargs["model"]),
        block_size=int(cache.get("tokens_per_block") or getattr(llm_args, "tokens_per_block", 32)),
        kv_capacity_blocks=blocks,
        max_num_seqs=int(getattr(llm_args, "max_batch_size", 0) or 0),
        max_num_batched_tokens=int(getattr(llm_args, "max_num_tokens", 0) or 0),
        context_length=int(getattr(llm_args, "max_seq_len", 0) or 0),
    )


def finish_reason(reason: str | None) -> FinishReason:
    if reason is not None and reason in FINISH_REASONS:
        return FINISH_REASONS[reason]
    raise EngineError(f"TensorRT-LLM ended the request with finish reason {reason!r}")


def disagg_to_params(kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """``DisaggregatedParams`` keywords from a request's hand-off: ``opaque_state`` travels
    as base64 text, so the hand-off stays JSON-safe like vLLM's."""
    params = dict(kv_transfer_params)
    if isinstance(params.get("opaque_state"), str):
        params["opaque_state"] = base64.b64decode(params["opaque_state"])
    return params


def params_to_disagg(params: Any) -> dict[str, Any] | None:
    """The hand-off a context-only (prefill) request returns, for the decode worker: its
    ``DisaggregatedParams`` as a dict, marked ``generation_only``."""
    if params is None:
        return None
    fields = ("ctx_request_id", "first_gen_tokens", "opaque_state", "draft_tokens")
    out: dict[str, Any] = {"request_type": "generation_only"}
    for name in fields:
        value = getattr(params, name, None)
        if value is not None:
            out[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return out


SAMPLING_FIELDS: Final = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed",
)  # fmt: skip
"""Our request's fields that TensorRT-LLM's ``SamplingParams`` has under the same name."""


def sampling_kwargs(request: GenerateRequest) -> dict[str, Any]:
    """TensorRT-LLM ``SamplingParams`` keywords (None fields: its defaults).
    ``ignore_eos`` drops the end-of-sequence ids, never the client's stop ids."""
    stops = list(request.user_stop_token_ids)
    if not request.ignore_eos:
        stops += request.stop_token_ids
    kwargs: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "stop_token_ids": list(dict.fromkeys(stops)) or None,
        "ignore_eos": request.ignore_eos,
        "detokenize": False,
    }
    for name in SAMPLING_FIELDS:
        value = getattr(request, name)
        if value is not None:
            kwargs[name] = value
    if request.top_k is not None and request.top_k <= 0:
        kwargs["top_k"] = 0  # TensorRT-LLM's "off"
    if request.min_tokens:
        kwargs["min_tokens"] = request.min_tokens
    if request.logit_bias:
        kwargs["logit_bias"] = dict(request.logit_bias)
    if request.logprobs is not None:
        kwargs["logprobs"] = request.logprobs
    return kwargs


def token_logprobs(completion: Any, count: int) -> list[TokenLogprobs]:
    """Ours for a streamed output's last ``count`` tokens: TensorRT-LLM's
    ``completion.logprobs`` holds, per token so far, a ``{token_id: Logprob}`` dict
    (vLLM's shape) or a float."""
    ids = list(completion.token_ids)[-count:] if count else []
    positions = list(completion.logprobs or [])[-count:] if count else []
    entries = []
    for token_id, position in zip(ids, positions, strict=False):
        if isinstance(position, dict):
            sampled = position.get(token_id)
            ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)
            entries.append(
                TokenLogprobs(
                    logprob=sampled.logprob if sampled is not None else -9999.0,
                    top_ids=[i for i, _ in ranked],
                    top_logprobs=[lp.logprob for _, lp in ranked],
                )
            )
        else:
            entries.append(TokenLogprobs(logprob=float(position)))
    return entries
