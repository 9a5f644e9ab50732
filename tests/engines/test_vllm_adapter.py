"""The vLLM adapter's pieces that need no vLLM: arguments, KV-event endpoints, sampling
parameters, finish reasons, load, the wire's disaggregation field and the lazy import."""

from __future__ import annotations

import sys

import msgspec
import pytest

from dynamoctl.engines import registry
from dynamoctl.engines.api import EngineError, KvEventSource
from dynamoctl.engines.vllm import args as vargs
from dynamoctl.engines.vllm.load import LoadTracker
from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.engine import GenerateChunk, GenerateRequest
from dynamoctl.wire.ids import packed


def test_a_kv_event_publisher_is_added_unless_the_recipe_has_one() -> None:
    added = vargs.with_kv_events({"model": "/m"})
    assert added["kv_events_config"] == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:0",
        "replay_endpoint": "tcp://*:0",
    }
    own = {"publisher": "zmq", "endpoint": "tcp://*:5557", "enable_kv_cache_events": True}
    assert vargs.with_kv_events({"kv_events_config": own})["kv_events_config"] is own
    assert "kv_events_config" not in vargs.with_kv_events({"enable_prefix_caching": False})


def test_arguments_are_rendered_for_vllms_parser() -> None:
    argv = vargs.engine_argv(
        {
            "model": "/models/llama",
            "max_num_seqs": 8,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        }
    )
    assert argv == [
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--kv-transfer-config",
        '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
        "--max-num-seqs",
        "8",
        "--model",
        "/models/llama",
    ]


@pytest.mark.parametrize(
    ("host", "ip"),
    [("127.0.0.1", "127.0.0.1"), ("10.0.0.5", "10.0.0.5"), ("::1", "::1"), ("0.0.0.0", None),
     ("::", None), ("gpu-node-1", None)],
)  # fmt: skip
def test_vllm_host_ip_follows_the_workers_bind_address(host: str, ip: str | None) -> None:
    assert vargs.bind_ip(host) == ip


def test_kv_event_source_from_what_vllm_bound() -> None:
    # tcp://*:0: vLLM reports the address it bound; registered as reported.
    assert vargs.kv_event_source(
        "tcp://*:0", "tcp://10.0.0.5:41234", "tcp://10.0.0.5:41235", "", "10.0.0.5"
    ) == KvEventSource("tcp://10.0.0.5:41234", "tcp://10.0.0.5:41235", "")
    # A fixed wildcard port: the wildcard becomes the worker's host.
    assert vargs.kv_event_source(
        "tcp://*:5557", "tcp://*:5557", "tcp://*:5558", "kv", "10.0.0.5"
    ) == KvEventSource("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "kv")
    assert vargs.advertised("tcp://*:5557", "::1") == "tcp://[::1]:5557"
    assert vargs.advertised("tcp://[::]:5557", "10.0.0.5") == "tcp://10.0.0.5:5557"
    ipc = vargs.kv_event_source("ipc:///tmp/kv", "ipc:///tmp/kv", None, "", "127.0.0.1")
    assert ipc == KvEventSource("ipc:///tmp/kv", None, "")
    # An endpoint vLLM connects to (an external collector) cannot be subscribed to.
    assert (
        vargs.kv_event_source("tcp://collector:5557", "tcp://collector:5557", None, "", "h") is None
    )
    assert vargs.kv_event_source("inproc://kv", "inproc://kv", None, "", "h") is None


def test_sampling_parameters() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.9, "stop_token_ids": [7]}
    request = GenerateRequest("r", [1, 2, 3], 16, stop_token_ids=[2, 7], seed=5)
    assert vargs.sampling_kwargs(request, defaults) == {
        "temperature": 0.6,  # the model's generation config, as vllm serve would
        "top_p": 0.9,
        "max_tokens": 16,
        "ignore_eos": False,
        "stop_token_ids": [2, 7],
        "detokenize": False,
        "skip_special_tokens": False,
        "seed": 5,
    }
    greedy = GenerateRequest("r", [1], 4, temperature=0.0, kv_transfer_params={"x": 1})
    kwargs = vargs.sampling_kwargs(greedy, {})
    assert kwargs["temperature"] == 0.0 and kwargs["stop_token_ids"] is None
    assert kwargs["extra_args"] == {"kv_transfer_params": {"x": 1}}
    # ignore_eos: every stop token is ignored (vLLM's own flag would keep stop_token_ids).
    bench = GenerateRequest("r", [1], 4, stop_token_ids=[2], ignore_eos=True)
    assert vargs.sampling_kwargs(bench, defaults)["stop_token_ids"] is None


def test_finish_reasons() -> None:
    assert [vargs.finish_reason(r) for r in ("stop", "length", "abort", "repetition")] == [
        "stop",
        "length",
        "abort",
        "stop",
    ]
    with pytest.raises(EngineError, match="'error'"):
        vargs.finish_reason("error")


def test_load_is_idle_when_vllm_has_nothing_unfinished() -> None:
    load = LoadTracker()
    load.total_blocks = 100
    load.started("a", 300)
    load.started("b", 200)
    load.on_scheduler_stats(running=1, kv_usage=0.25)
    busy = load.metrics(unfinished=2)
    assert (busy.num_running, busy.num_waiting, busy.active_blocks) == (1, 1, 25)
    assert busy.prefill_tokens_queued == 500 and busy.kv_usage == 0.25
    load.prefilled("a")
    assert load.metrics(unfinished=2).prefill_tokens_queued == 200
    # vLLM's last report said busy, but it has nothing unfinished: idle.
    load.finished("a")
    load.finished("b")
    idle = load.metrics(unfinished=0)
    assert (idle.num_running, idle.active_blocks, idle.kv_usage, idle.total_blocks) == (
        0,
        0,
        0.0,
        100,
    )
    assert load.live == []


class _OldGenerateRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """GenerateRequest before ``kv_transfer_params`` existed."""

    request_id: str
    token_ids: list[int]
    max_tokens: int
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    seed: int | None = None
    temperature: float | None = None


def test_kv_transfer_params_are_opaque_and_backward_compatible() -> None:
    old = _OldGenerateRequest("r", [1, 2], 8, stop_token_ids=[3], temperature=0.5)
    plain = GenerateRequest("r", packed([1, 2]), 8, stop_token_ids=[3], temperature=0.5)
    assert wire_engine.decode_request(msgspec.msgpack.encode(old)) == plain  # older peers
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "opaque": b"\x00\x01"}
    sent = GenerateRequest("r", [1], 1, kv_transfer_params=params)
    assert wire_engine.decode_request(wire_engine.encode(sent)).kv_transfer_params == params
    last = GenerateChunk([5], "length", kv_transfer_params={"remote_engine_id": "e"})
    assert wire_engine.decode_chunk(wire_engine.encode(last)) == last


def test_missing_vllm_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm → ImportError
    monkeypatch.delitem(sys.modules, "dynamoctl.engines.vllm.engine", raising=False)
    with pytest.raises(registry.EngineUnavailable) as err:
        registry.create_engine("vllm", {"model": "/m"})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("engine 'vllm' is not installed")
    assert message.endswith("pip install 'dynamoctl[vllm]'")


def test_every_sampling_field_is_a_real_sampling_params_field() -> None:
    from vllm import SamplingParams

    request = GenerateRequest(
        "r", [1, 2], 16, stop_token_ids=[2], seed=7, temperature=0.5, top_p=0.9, top_k=40,
        min_p=0.1, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1,
        logit_bias={5: -100.0}, min_tokens=3, user_stop_token_ids=[9], logprobs=2,
    )  # fmt: skip
    kwargs = vargs.sampling_kwargs(request, {})
    params = SamplingParams(**kwargs)  # vLLM validates them
    assert params.stop_token_ids == [9, 2] and params.min_tokens == 3 and params.logprobs == 2
    assert (params.top_k, params.min_p, params.repetition_penalty) == (40, 0.1, 1.1)
    assert params.logit_bias == {5: -100.0} and params.seed == 7
    # ignore_eos drops the end-of-sequence ids, never the client's own stop ids.
    bench = GenerateRequest(
        "r", [1], 4, stop_token_ids=[2], ignore_eos=True, user_stop_token_ids=[9]
    )
    assert vargs.sampling_kwargs(bench, {"stop_token_ids": [3]})["stop_token_ids"] == [9]


def test_vllm_logprobs_become_ours() -> None:
    from vllm.logprobs import Logprob

    positions = [
        {11: Logprob(-0.2, rank=1), 4: Logprob(-1.9, rank=2), 8: Logprob(-2.5, rank=3)},
        {12: Logprob(-3.0, rank=5), 6: Logprob(-0.1, rank=1), 7: Logprob(-0.9, rank=2)},
    ]
    first, second = vargs.token_logprobs([11, 12], positions, 2)
    assert (first.logprob, first.top_ids, first.top_logprobs) == (-0.2, [11, 4], [-0.2, -1.9])
    # The sampled token outside the top 2 keeps its log-probability, not a place in the top.
    assert (second.logprob, second.top_ids) == (-3.0, [6, 7])


def test_vllm_prompt_logprobs_become_ours() -> None:
    """``SamplingParams.prompt_logprobs`` is asked for; vLLM's per-position dicts (None
    first) become ours with the prompt token's rank, and travel in the chunk."""
    from vllm.logprobs import Logprob

    request = GenerateRequest("r", [1, 2, 3], 1, prompt_logprobs=1)
    assert vargs.sampling_kwargs(request, {})["prompt_logprobs"] == 1
    assert "prompt_logprobs" not in vargs.sampling_kwargs(GenerateRequest("r", [1], 1), {})
    positions = [
        None,
        {2: Logprob(-0.3, rank=1)},
        {3: Logprob(-4.0, rank=7), 9: Logprob(-0.2, rank=1)},
    ]
    first, second, third = vargs.prompt_token_logprobs([1, 2, 3], positions, 1)
    assert first is None
    assert second is not None and (second.logprob, second.rank, second.top_ids) == (-0.3, 1, [2])
    assert third is not None and (third.logprob, third.rank, third.top_ids) == (-4.0, 7, [9])
    chunk = GenerateChunk([5], prompt_logprobs=[first, second, third])
    assert wire_engine.decode_chunk(wire_engine.encode(chunk)) == chunk
