"""vLLM's side of the adapter that needs no vLLM: engine arguments, KV-event endpoints,
sampling parameters and finish reasons, as plain data.

Engine arguments go to vLLM's own command-line parser, rendered exactly as ``vllm serve``
would receive them, so a recipe's ``engine_args`` mean what vLLM's documentation says.
What the adapter adds when the recipe sets none: a KV-event publisher (routers need it),
here, and a drain-friendly ``shutdown_timeout`` (:mod:`dynamoctl.engines.vllm.engine`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dynamoctl.engines.api import EngineError, FinishReason, GenerateRequest, KvEventSource
from dynamoctl.wire.engine import TokenLogprobs
from dynamoctl.wire.engine_args import render_engine_args

ANY_PORT: Final = "tcp://*:0"
"""vLLM >= 0.32 binds this on the node's IP (``VLLM_HOST_IP``) with a free port, and
reports the bound address back (``AsyncLLM.get_kv_event_sources``)."""

DEFAULT_KV_EVENTS: Final[Mapping[str, Any]] = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": ANY_PORT,
    "replay_endpoint": ANY_PORT,
}
"""The publisher the adapter asks for when the recipe configures none."""

FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",  # vLLM's repetition detector ended it: an ordinary stop
}
"""vLLM's finish reasons → ours; ``error`` is raised instead (see :func:`finish_reason`)."""


def with_kv_events(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` plus the default KV-event publisher, unless the recipe configures one or
    turns prefix caching off (no cache: nothing to route on). A recipe's own
    ``kv_events_config`` is passed through untouched."""
    out = dict(options)
    if "kv_events_config" not in out and out.get("enable_prefix_caching") is not False:
        out["kv_events_config"] = dict(DEFAULT_KV_EVENTS)
    return out


def engine_argv(options: Mapping[str, Any]) -> list[str]:
    """The command line vLLM's parser receives: ``{"max_num_seqs": 8}`` →
    ``["--max-num-seqs", "8"]`` (objects as JSON, ``False`` as ``--no-NAME``)."""
    return render_engine_args(options)


def bind_ip(host: str) -> str | None:
    """The address to give vLLM as ``VLLM_HOST_IP`` for a worker bound on ``host``; None
    for wildcards and names (vLLM then finds the node's address itself)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if address.is_unspecified else host


def binds(endpoint: str) -> bool:
    """Whether vLLM *binds* its KV-event PUB socket on ``endpoint``: with ``*``, ``::``,
    ``ipc://`` or ``inproc://``. Any other endpoint it connects to (an external
    collector), which no router can subscribe to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def advertised(endpoint: str, host: str) -> str | None:
    """The address subscribers connect to for a socket vLLM bound on ``endpoint``, on a
    worker bound on ``host``: a wildcard becomes ``host`` (as the worker's own sockets
    advertise it); ``inproc://`` cannot be reached from outside: None."""
    if endpoint.startswith("inproc://"):
        return None
    name = f"[{host}]" if ":" in host else host
    for wildcard in ("*", "[::]"):
        if wildcard in endpoint:
            return endpoint.replace(wildcard, name, 1)
    return endpoint


def kv_event_source(
    configured: str, endpoint: str, replay_endpoint: str | None, topic: str, host: str
) -> KvEventSource | None:
    """The stream to register for a vLLM publisher configured with ``configured`` and
    reporting ``endpoint`` once bound (vLLM resolves ``tcp://*:0``); None when routers
    cannot follow it."""
    address = advertised(endpoint, host) if binds(configured) else None
    if address is None:
        return None
    replay = advertised(replay_endpoint, host) if replay_endpoint else None
    return KvEventSource(address, replay, topic)


def sampling_kwargs(request: GenerateRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``SamplingParams`` keywords for ``request``: the model's generation-config defaults
    (vLLM's ``get_diff_sampling_param``), overridden by what the request sets.

    ``ignore_eos`` in our protocol ignores the end-of-sequence ids (``stop_token_ids``,
    with the model's own), never the client's ``user_stop_token_ids``, as vLLM's flag does.
    Token ids in and out: nothing is detokenised.
    """
    kwargs = dict(defaults)
    model_stops = kwargs.pop("stop_token_ids", None) or ()
    eos = [] if request.ignore_eos else [*request.stop_token_ids, *model_stops]
    stop = list(dict.fromkeys([*request.user_stop_token_ids, *eos]))
    kwargs.update(
        max_tokens=request.max_tokens,
        ignore_eos=request.ignore_eos,
        stop_token_ids=stop or None,
        detokenize=False,
        skip_special_tokens=False,
    )
    for name in SAMPLING_FIELDS:
        value = getattr(request, name)
        if value is not None:
            kwargs[name] = value
    if request.min_tokens:
        kwargs["min_tokens"] = request.min_tokens
    if request.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = request.prompt_logprobs
    if request.kv_transfer_params is not None:
        kwargs["extra_args"] = {"kv_transfer_params": request.kv_transfer_params}
    return kwargs


SAMPLING_FIELDS: Final = (
    "seed", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
)  # fmt: skip
"""Fields of :class:`GenerateRequest` that are ``SamplingParams`` fields of the same name
and meaning (None: the model's default)."""


def vllm_priority(priority: int) -> int:
    """A request's priority as vLLM takes it: vLLM admits *lower* values first, dynamoctl
    higher (:attr:`GenerateRequest.priority`). Under vLLM's default ``fcfs`` policy the
    value is not used."""
    return -priority


def token_logprobs(
    token_ids: Sequence[int], positions: Sequence[Mapping[int, Any] | None], top: int
) -> list[TokenLogprobs]:
    """Ours from vLLM's per-position ``{token_id: Logprob}`` (the sampled token, whatever
    its rank, and the ``top`` most likely, ranked 1..top)."""
    entries = []
    for token_id, position in zip(token_ids, positions, strict=False):
        position = position or {}
        sampled = position.get(token_id)
        ranked = sorted(
            (lp.rank, i, lp.logprob)
            for i, lp in position.items()
            if lp.rank is not None and lp.rank <= top
        )
        entries.append(
            TokenLogprobs(
                logprob=sampled.logprob if sampled is not None else MISSING_LOGPROB,
                top_ids=[i for _, i, _ in ranked],
                top_logprobs=[p for _, _, p in ranked],
            )
        )
    return entries


def prompt_token_logprobs(
    token_ids: Sequence[int], positions: Sequence[Mapping[int, Any] | None], top: int
) -> list[TokenLogprobs | None]:
    """Ours from vLLM's ``prompt_logprobs`` (None where vLLM has none: the first token),
    each with the prompt token's rank."""
    entries: list[TokenLogprobs | None] = []
    for token_id, position in zip(token_ids, positions, strict=False):
        if position is None:
            entries.append(None)
            continue
        entry = token_logprobs([token_id], [position], top)[0]
        sampled = position.get(token_id)
        entry.rank = sampled.rank if sampled is not None else None
        entries.append(entry)
    return entries


MISSING_LOGPROB: Final = -9999.0
"""What a token vLLM gave no log-probability for gets (JSON has no -inf)."""


def finish_reason(reason: str | None) -> FinishReason:
    """Ours for a finished vLLM output; an engine-side failure raises."""
    if reason is not None and reason in FINISH_REASONS:
        return FINISH_REASONS[reason]
    raise EngineError(f"vLLM ended the request with finish reason {reason!r}")
