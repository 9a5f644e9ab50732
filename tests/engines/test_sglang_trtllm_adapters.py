"""SGLang and TensorRT-LLM adapters without the engines (neither installs on these
machines): argument translation, event decoding from wire samples written after their
documented formats, hand-off parameters, and the one-line error when the package is
missing. The samples are ours, not recordings of a running engine: see docs/engines.md."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from dynamoctl.engines import registry
from dynamoctl.engines.api import EngineError, GenerateRequest
from dynamoctl.engines.common import ChildWatch, RequestLoad, poll_death
from dynamoctl.engines.sglang import args as sargs
from dynamoctl.engines.trtllm import args as targs
from dynamoctl.engines.trtllm.events import convert_events
from dynamoctl.router import KvRouter
from dynamoctl.wire.kv_events import BlockRemoved, BlockStored, decode_batch

# ----------------------------------------------------------------------- SGLang


def test_sglang_server_args() -> None:
    args = sargs.server_args(
        {"model": "/m", "served_model_name": "m", "block_size": 16, "max_model_len": 4096,
         "tp_size": 2, "mem_fraction_static": 0.85},
        ("tcp://*:6000", "tcp://*:6001"),
    )  # fmt: skip
    assert args == {
        "model_path": "/m",
        "served_model_name": "m",
        "page_size": 16,
        "context_length": 4096,
        "tp_size": 2,
        "mem_fraction_static": 0.85,
        "skip_tokenizer_init": True,
        "kv_events_config": json.dumps(
            {"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001"}
        ),
    }
    assert sargs.kv_events(args) == {
        "publisher": "zmq",
        "endpoint": "tcp://*:6000",
        "replay_endpoint": "tcp://*:6001",
    }
    own = {"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}
    kept = sargs.server_args({"kv_events_config": own}, ("tcp://*:1", "tcp://*:2"))
    assert json.loads(kept["kv_events_config"]) == own
    no_cache = sargs.server_args({"disable_radix_cache": True}, ("tcp://*:1", "tcp://*:2"))
    assert "kv_events_config" not in no_cache and sargs.kv_events(no_cache) is None
    with pytest.raises(ValueError, match="--block-size 16 and --page-size 32"):
        sargs.server_args({"block_size": 16, "page_size": 32}, None)
    with pytest.raises(ValueError, match="skip-tokenizer-init"):
        sargs.server_args({"skip_tokenizer_init": False}, None)


def test_sglang_streamed_outputs_and_finish_reasons() -> None:
    assert sargs.new_tokens([5, 6, 7], seen=2, incremental=False) == [7]
    assert sargs.new_tokens([7], seen=2, incremental=True) == [7]
    assert sargs.finish_reason({"finish_reason": None}) is None
    assert sargs.finish_reason({"finish_reason": {"type": "length", "length": 8}}) == "length"
    assert sargs.finish_reason({"finish_reason": {"type": "stop", "matched": 2}}) == "stop"
    assert sargs.finish_reason({"finish_reason": {"type": "abort"}}) == "abort"
    with pytest.raises(EngineError):
        sargs.finish_reason({"finish_reason": {"type": "error", "message": "oom"}})


def test_sglang_model_card_and_bootstrap() -> None:
    info = {
        "model_path": "/models/qwen",
        "served_model_name": "qwen",
        "tokenizer_path": None,
        "page_size": 16,
        "max_total_num_tokens": 160_000,
        "max_running_requests": 256,
        "chunked_prefill_size": 8192,
        "context_length": 32768,
    }
    card = sargs.model_card(info, None)
    assert (card.model, card.tokenizer, card.block_size, card.kv_capacity_blocks) == (
        "qwen",
        "/models/qwen",
        16,
        10_000,
    )
    assert (card.max_num_seqs, card.max_num_batched_tokens, card.context_length) == (
        256,
        8192,
        32768,
    )
    handoff = sargs.bootstrap_info("10.0.0.5", 8998, 1234)
    assert sargs.bootstrap_kwargs(handoff) == handoff
    assert sargs.bootstrap_kwargs({"bootstrap_room": 7, "other": 1}) == {"bootstrap_room": 7}
    assert sargs.bootstrap_kwargs(None) == {}


def test_sglang_kv_events_decode() -> None:
    """SGLang's publisher is vLLM's (positional structs, as vLLM <= 0.23); its radix
    cache may hash to negative ints."""
    tokens = list(range(32))
    payload = msgspec.msgpack.encode(
        [1700000000.5,
         [["BlockStored", [-42, 7], None, tokens, 16, None],
          ["BlockRemoved", [-42]],
          ["AllBlocksCleared"]],
         0]
    )  # fmt: skip
    batch = decode_batch(payload)
    stored, removed = batch.events[0], batch.events[1]
    assert isinstance(stored, BlockStored) and stored.block_hashes == [-42, 7]
    assert stored.token_ids == tokens and stored.block_size == 16 and stored.medium is None
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [-42]
    assert batch.data_parallel_rank == 0 and len(batch.events) == 3


# ----------------------------------------------------------------------- TensorRT-LLM


def test_trtllm_llm_kwargs() -> None:
    kwargs = targs.llm_kwargs(
        {"model": "/m", "served_model_name": "m", "block_size": 32, "max_model_len": 8192,
         "max_num_seqs": 64, "tensor_parallel_size": 2,
         "kv_cache_config": {"free_gpu_memory_fraction": 0.8}},
    )  # fmt: skip
    assert kwargs == {
        "model": "/m",
        "tensor_parallel_size": 2,
        "max_seq_len": 8192,
        "max_batch_size": 64,
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.8,
            "tokens_per_block": 32,
            "event_buffer_max_size": targs.EVENT_BUFFER,
        },
    }
    off = targs.llm_kwargs({"model": "/m", "enable_prefix_caching": False})
    assert off["kv_cache_config"] == {"enable_block_reuse": False}
    with pytest.raises(ValueError, match=r"kv-cache-config\.tokens_per_block 64"):
        targs.llm_kwargs({"block_size": 32, "kv_cache_config": {"tokens_per_block": 64}})


def _stored(parent: int | None, blocks: list[tuple[int, list[int]]], level: int = 0) -> Any:
    """A ``stored`` event as TensorRT-LLM's ``KVCacheEventSerializer`` writes it."""

    def block(block_hash: int, ids: list[int]) -> dict[str, Any]:
        return {
            "type": "stored_block",
            "block_hash": block_hash,
            "lora_id": None,
            "cache_level": level,
            "priority": 35,
            "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in ids],
        }

    data = {"type": "stored", "parent_hash": parent, "blocks": [block(*b) for b in blocks]}
    return {"event_id": 1, "window_size": 4096, "data": data}


def test_trtllm_kv_events_feed_the_router() -> None:
    prompt = list(range(100, 164))  # two blocks of 32
    events = [
        {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [1000, 0]}},
        _stored(None, [(11, prompt[:32]), (12, prompt[32:]), (13, [1, 2, 3])]),  # 13: partial
        _stored(12, [(14, list(range(32)))], level=1),  # offloaded to host: not counted
        {"event_id": 3, "data": {"type": "removed", "block_hashes": [99]}},
    ]
    batch = convert_events(events, block_size=32, dp_rank=None)
    assert batch is not None
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [11, 12] and stored.token_ids == prompt
    assert batch.events[1].medium == "CPU"  # type: ignore[union-attr]
    assert isinstance(batch.events[2], BlockRemoved) and batch.events[2].block_hashes == [99]
    router = KvRouter("kv", block_size=32)
    router.add_worker("w")
    router.apply_kv_batch("w", batch)
    assert router.find_matches([*prompt, 1, 2]) == {"w": 2}
    assert convert_events([events[0]], block_size=32) is None


def test_trtllm_disaggregated_params_round_trip() -> None:
    ctx = SimpleNamespace(
        request_type="context_only",
        ctx_request_id=17,
        first_gen_tokens=[42],
        opaque_state=b"\x00\xffstate",
        draft_tokens=None,
    )
    handoff = targs.params_to_disagg(ctx)
    assert handoff == {
        "request_type": "generation_only",
        "ctx_request_id": 17,
        "first_gen_tokens": [42],
        "opaque_state": "AP9zdGF0ZQ==",
    }
    assert json.loads(json.dumps(handoff)) == handoff  # JSON-safe, like vLLM's
    assert targs.disagg_to_params(handoff)["opaque_state"] == b"\x00\xffstate"
    assert targs.params_to_disagg(None) is None
    assert targs.finish_reason("cancelled") == "abort"
    with pytest.raises(EngineError):
        targs.finish_reason(None)


def test_request_load_estimate() -> None:
    load = RequestLoad(block_size=16, total_blocks=10)
    load.started("a", 40)
    assert load.metrics().prefill_tokens_queued == 40
    load.produced("a", 9)  # 49 tokens: 4 blocks
    metrics = load.metrics()
    assert (metrics.active_blocks, metrics.num_running, metrics.prefill_tokens_queued) == (4, 1, 0)
    assert metrics.kv_usage == 0.4
    load.finished("a")
    assert load.metrics().num_running == 0


def test_child_watch_reports_the_death_of_a_process_the_engine_started() -> None:
    """What the SGLang adapter's death report rests on, with real child processes: only
    children started during the engine's start are watched, and a SIGKILLed one is named."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    older = subprocess.Popen(sleep)
    try:
        watch = ChildWatch("Engine")
        child = subprocess.Popen(sleep)  # "started by the engine"
        watch.started()
        assert watch.pids == [child.pid]
        assert watch.gone() is None
        older.kill()
        older.wait()
        assert watch.gone() is None  # not the engine's
        child.send_signal(signal.SIGKILL)  # left unreaped: a zombie is dead too
        died = asyncio.run(asyncio.wait_for(poll_death(watch.gone, interval=0.05), 10))
        assert str(died).startswith("Engine process python")
        assert str(died).endswith(f"(pid {child.pid}) exited")
        child.wait()
        assert watch.gone() is not None  # reaped: still reported
    finally:
        for proc in (older, child):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ----------------------------------------------------------------------- lazy imports


@pytest.mark.parametrize(("engine", "package"), [("sglang", "sglang"), ("trtllm", "tensorrt_llm")])
def test_missing_engine_is_one_line_naming_the_extra(
    engine: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.delitem(sys.modules, f"dynamoctl.engines.{engine}.engine", raising=False)
    with pytest.raises(registry.EngineUnavailable) as err:
        registry.create_engine(engine, {"model": "/m"})
    assert str(err.value).startswith(f"engine {engine!r} is not installed")
    assert str(err.value).endswith(f"pip install 'dynamoctl[{engine}]'")
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------- sampling


FULL = GenerateRequest(
    "r", [1, 2], 16, stop_token_ids=[2], seed=7, temperature=0.5, top_p=0.9, top_k=0,
    min_p=0.1, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1,
    logit_bias={5: -100.0}, min_tokens=3, user_stop_token_ids=[9], logprobs=2,
)  # fmt: skip


def test_sglang_sampling_params() -> None:
    assert sargs.sampling_params(FULL) == {
        "max_new_tokens": 16, "stop_token_ids": [9, 2], "temperature": 0.5, "top_p": 0.9,
        "top_k": -1, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "repetition_penalty": 1.1, "sampling_seed": 7, "min_new_tokens": 3,
        "logit_bias": {"5": -100.0},
    }  # fmt: skip
    bench = sargs.sampling_params(GenerateRequest("r", [1], 4, stop_token_ids=[2], ignore_eos=True))
    assert bench == {"max_new_tokens": 4, "ignore_eos": True}
    assert sargs.logprob_kwargs(FULL) == {"return_logprob": True, "top_logprobs_num": 2}
    assert sargs.logprob_kwargs(GenerateRequest("r", [1], 4)) == {}
    meta = {
        "output_token_logprobs": [(-0.1, 11, None), (-0.7, 12, None)],
        "output_top_logprobs": [[(-0.1, 11, None), (-2.0, 4, None)], [(-0.5, 3, None)]],
    }
    last = sargs.token_logprobs(meta, 1, 1)
    assert [(e.logprob, e.top_ids, e.top_logprobs) for e in last] == [(-0.7, [3], [-0.5])]


def test_trtllm_sampling_kwargs() -> None:
    assert targs.sampling_kwargs(FULL) == {
        "max_tokens": 16, "stop_token_ids": [9, 2], "ignore_eos": False, "detokenize": False,
        "temperature": 0.5, "top_p": 0.9, "top_k": 0, "min_p": 0.1, "presence_penalty": 0.5,
        "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 7, "min_tokens": 3,
        "logit_bias": {5: -100.0}, "logprobs": 2,
    }  # fmt: skip
    lp = SimpleNamespace
    completion = lp(token_ids=[11, 12], logprobs=[{11: lp(logprob=-0.1)}, {12: lp(logprob=-0.3),
                    4: lp(logprob=-1.5)}])  # fmt: skip
    (entry,) = targs.token_logprobs(completion, 1)
    assert (entry.logprob, entry.top_ids, entry.top_logprobs) == (-0.3, [12, 4], [-0.3, -1.5])
