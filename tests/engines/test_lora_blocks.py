"""LoRA adapters in the KV identity: the mocker's blocks under an adapter are not the base
model's nor another adapter's, its events name the adapter, and a router indexes them
so that only requests for that adapter see them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.engines.api import AdapterRefused, RequestRejected
from dynamoctl.kv import hashing
from dynamoctl.kv.hash_cache import HashCache
from dynamoctl.router.router import KvRouter
from dynamoctl.wire.engine import LoadMetrics
from dynamoctl.wire.kv_events import BlockStored, KVEventBatch

PROMPT = list(range(2000, 2100))  # 100 tokens: 6 full blocks of 16
LOAD = LoadMetrics(active_blocks=0, total_blocks=1000, num_waiting=0, num_running=0,
                   prefill_tokens_queued=0, kv_usage=0.0)  # fmt: skip


def adapter_dir(tmp_path: Path, name: str, base: str = "mock-llama") -> str:
    path = tmp_path / name
    path.mkdir()
    config = {"peft_type": "LORA", "base_model_name_or_path": base, "r": 8}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return str(path)


def test_an_adapter_seeds_its_chain_apart_from_the_base_and_other_adapters() -> None:
    base = hashing.sequence_hashes(PROMPT, 16)
    sql = hashing.sequence_hashes(PROMPT, 16, hashing.adapter_parent("sql"))
    chat = hashing.sequence_hashes(PROMPT, 16, hashing.adapter_parent("chat"))
    assert hashing.adapter_parent(None) is None
    assert not set(base) & set(sql) and not set(sql) & set(chat) and not set(base) & set(chat)
    # The router's cache of recent prompts hashes an adapter's prompts the same way.
    cache = HashCache(16, parent=hashing.adapter_parent("sql"))
    assert cache.sequence_hashes(PROMPT) == sql
    assert cache.sequence_hashes(PROMPT[:96] + [5] * 16) == sql + hashing.chain(
        hashing.local_hashes([5] * 16, 16), sql[-1]
    )


async def test_mocker_blocks_of_an_adapter_are_its_own(make_mocker: Any, tmp_path: Path) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100, max_loras=2, lora_load_s=2.0)
    t0 = m.clock.now()
    await m.engine.load_adapter("sql", adapter_dir(tmp_path, "sql"))
    assert m.clock.now() - t0 == pytest.approx(2.0)  # the simulated load time
    assert (await m.run("base", PROMPT, 1)).cached == 0
    # The base model's blocks are no hit for the adapter, and its own are.
    assert (await m.run("sql-1", PROMPT, 1, adapter="sql")).cached == 0
    assert (await m.run("sql-2", PROMPT, 1, adapter="sql")).cached == 96
    stored = [e for b in m.batches for e in b.events if isinstance(e, BlockStored)]
    names = [e.lora_name for e in stored]
    assert names == [None, "sql"]
    sql = hashing.sequence_hashes(PROMPT, 16, hashing.adapter_parent("sql"))
    assert stored[1].block_hashes == sql
    # An adapter not loaded here is refused; so is one past max_loras.
    with pytest.raises(RequestRejected, match="not loaded here"):
        await m.run("chat-1", PROMPT, 1, adapter="chat")
    await m.engine.load_adapter("chat", adapter_dir(tmp_path, "chat"))
    with pytest.raises(AdapterRefused, match="max_loras 2"):
        await m.engine.load_adapter("third", adapter_dir(tmp_path, "third"))
    await m.engine.unload_adapter("chat")
    with pytest.raises(RequestRejected, match="not loaded here"):
        await m.run("chat-2", PROMPT, 1, adapter="chat")


async def test_router_counts_an_adapters_blocks_only_for_it(
    make_mocker: Any, tmp_path: Path
) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100, max_loras=1)
    await m.engine.load_adapter("sql", adapter_dir(tmp_path, "sql"))
    await m.run("sql", PROMPT, 1, adapter="sql")
    base_router, sql_router = KvRouter("kv", 16), KvRouter("kv", 16, adapter="sql")
    for router in (base_router, sql_router):
        router.add_worker("w")
        router.update_load("w", LOAD)
        for batch in m.batches:
            router.apply_kv_batch("w", batch)
    assert sql_router.find_matches(PROMPT) == {"w": 6}
    assert base_router.find_matches(PROMPT) == {}  # the adapter's blocks are not the base's
    # vLLM's events carry the engine's own hashes and the adapter's name: the same result.
    vllm_like = KVEventBatch(0.0, [BlockStored([11, 12], None, PROMPT[:32], 16, lora_name="sql")])
    fresh = KvRouter("kv", 16, adapter="sql")
    fresh.add_worker("v")
    fresh.apply_kv_batch("v", vllm_like)
    assert fresh.find_matches(PROMPT) == {"v": 2}


def test_mocker_without_lora_refuses_adapters(tmp_path: Path) -> None:
    from dynamoctl.engines.mocker import MockerConfig, MockerEngine

    engine = MockerEngine(MockerConfig())
    assert not engine.serves_adapters()
    import asyncio

    with pytest.raises(AdapterRefused, match="LoRA is off"):
        asyncio.run(engine.load_adapter("sql", adapter_dir(tmp_path, "sql")))
