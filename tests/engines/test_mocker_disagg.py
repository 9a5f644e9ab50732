"""Mocker disaggregation: pinned prefills, pulls over the real request plane, the TTL, and
explicit failures (unknown, expired, dead prefill worker, wrong prompt)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dynamoctl.engines.api import GenerateRequest, KvTransferFailed, PrefillsForRemoteDecode
from dynamoctl.engines.mocker import MockerEngine
from dynamoctl.planes.request import RequestServer
from tests.engines.conftest import Harness

PROMPT = list(range(2000, 2100))  # 100 tokens: 6 full blocks of 16 + a partial one
BS = 16


class PrefillSide:
    """A prefill mocker behind a real request server that serves its ``kv_pull``."""

    def __init__(self, harness: Harness, server: RequestServer) -> None:
        self.m, self.server = harness, server

    async def prefill(self, rid: str, prompt: list[int] = PROMPT) -> dict[str, Any]:
        marker = dict(self.m.engine.remote_prefill_params())
        out = await self.m.run(rid, prompt, 1, kv_transfer_params=marker)
        assert out.finish == "length" and len(out.tokens) == 1
        handoff = out.chunks[-1].kv_transfer_params
        assert handoff is not None
        return handoff


@pytest.fixture
async def prefill_side(make_mocker: Any) -> AsyncIterator[Any]:
    servers: list[RequestServer] = []

    async def make(**options: Any) -> PrefillSide:
        harness = await make_mocker(block_size=BS, num_gpu_blocks=64, **options)
        server = RequestServer("tcp://127.0.0.1:0")
        for name, handler in harness.engine.peer_endpoints().items():
            server.register(name, handler)
        await server.start()
        harness.engine.set_peer_address(server.address)
        servers.append(server)
        return PrefillSide(harness, server)

    yield make
    for server in servers:
        await server.close()


async def test_prefill_pins_then_decode_pulls_and_generates_the_same_tokens(
    prefill_side: Any, make_mocker: Any
) -> None:
    p = await prefill_side()
    assert isinstance(p.m.engine, PrefillsForRemoteDecode)
    handoff = await p.prefill("p1")
    blocks = math.ceil(len(PROMPT) / BS)
    assert handoff["num_blocks"] == blocks and handoff["remote_address"] == p.server.address
    # Pinned: the finished prefill still holds its blocks (the router sees them as load).
    assert p.m.engine.load_metrics().active_blocks == blocks
    p.m.engine.scheduler.check_invariants()

    d = await make_mocker(block_size=BS, num_gpu_blocks=64, kv_transfer_gbps=1.0)
    out = await d.run("d1", PROMPT, 8, seed=7, kv_transfer_params=handoff)
    agg = await (await make_mocker(block_size=BS, num_gpu_blocks=64)).run("a", PROMPT, 8, seed=7)
    assert out.tokens == agg.tokens and out.finish == "length"
    # The decode computed no prompt: only the last prompt token, as a decode step.
    assert d.engine.stats.prefill_tokens == 0
    assert (out.chunks[0].prompt_tokens, out.chunks[0].cached_tokens) == (100, 99)
    # Transfer time was charged on the decode's clock: bytes / bandwidth.
    seconds = blocks * BS * d.engine.config.kv_bytes_per_token / 1e9
    assert d.engine.transfers.stats.transfer_s == pytest.approx(seconds)
    assert out.times[0] >= seconds
    assert d.engine.transfers.stats.received_blocks == blocks
    # The pull unpinned the prefill's blocks (they stay cached, no longer held).
    assert p.m.engine.load_metrics().active_blocks == 0
    assert p.m.engine.transfers.stats.pulled == 1
    p.m.engine.scheduler.check_invariants()
    d.engine.scheduler.check_invariants()


async def test_a_second_pull_of_the_same_transfer_fails_explicitly(
    prefill_side: Any, make_mocker: Any
) -> None:
    p = await prefill_side()
    handoff = await p.prefill("p1")
    d = await make_mocker(block_size=BS, num_gpu_blocks=64)
    await d.run("d1", PROMPT, 2, kv_transfer_params=handoff)
    with pytest.raises(KvTransferFailed, match="unknown or expired"):
        await d.run("d2", PROMPT, 2, kv_transfer_params=handoff)
    assert d.engine.load_metrics().num_running == 0


async def test_unpulled_pins_expire_after_the_ttl(prefill_side: Any, make_mocker: Any) -> None:
    p = await prefill_side(kv_pin_ttl=0.2)
    handoff = await p.prefill("p1")
    assert p.m.engine.transfers.num_pinned == 1
    await asyncio.sleep(0.5)
    assert p.m.engine.transfers.num_pinned == 0 and p.m.engine.transfers.stats.expired == 1
    assert p.m.engine.load_metrics().active_blocks == 0
    p.m.engine.scheduler.check_invariants()
    d = await make_mocker(block_size=BS, num_gpu_blocks=64)
    with pytest.raises(KvTransferFailed, match="expired"):
        await d.run("d1", PROMPT, 2, kv_transfer_params=handoff)


async def test_a_pull_from_a_dead_prefill_worker_fails_instead_of_hanging(
    prefill_side: Any, make_mocker: Any
) -> None:
    p = await prefill_side()
    handoff = await p.prefill("p1")
    await p.server.close()
    d = await make_mocker(block_size=BS, num_gpu_blocks=64)
    d.engine.transfers.pull_timeout = 1.0
    with pytest.raises(KvTransferFailed, match="failed"):
        await asyncio.wait_for(d.run("d1", PROMPT, 2, kv_transfer_params=handoff), 10)


async def test_a_handoff_for_another_prompt_is_refused(prefill_side: Any, make_mocker: Any) -> None:
    p = await prefill_side()
    handoff = await p.prefill("p1")
    d = await make_mocker(block_size=BS, num_gpu_blocks=64)
    with pytest.raises(KvTransferFailed, match="another prompt"):
        await d.run("d1", [5] * 100, 2, kv_transfer_params=handoff)
    # Nothing was pulled: the right decode request still gets the blocks.
    assert p.m.engine.transfers.num_pinned == 1


async def test_a_malformed_handoff_is_rejected(make_mocker: Any) -> None:
    d = await make_mocker(block_size=BS, num_gpu_blocks=64)
    with pytest.raises(Exception, match="malformed mocker KV hand-off"):
        await d.run("d1", PROMPT, 2, kv_transfer_params={"transfer_id": 3})


async def test_do_remote_decode_needs_a_kv_pull_endpoint(make_mocker: Any) -> None:
    m = await make_mocker(block_size=BS, num_gpu_blocks=64)
    with pytest.raises(Exception, match="kv_pull"):
        await m.run("p", PROMPT, 1, kv_transfer_params={"do_remote_decode": True})


async def test_stop_releases_pinned_blocks(prefill_side: Any) -> None:
    p = await prefill_side()
    await p.prefill("p1")
    engine: MockerEngine = p.m.engine
    await engine.stop()
    assert engine.load_metrics().active_blocks == 0 and engine.transfers.num_pinned == 0
    engine.scheduler.check_invariants()
    await engine.start()
    out = await p.m.read(engine.generate(GenerateRequest("again", PROMPT, 2)))
    assert out.finish == "length"


async def test_a_lora_adapters_prefill_hands_off_its_own_blocks(
    prefill_side: Any, make_mocker: Any, tmp_path: Any
) -> None:
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    p = await prefill_side(max_loras=1)
    await p.m.engine.load_adapter("sql", str(tmp_path))
    marker = dict(p.m.engine.remote_prefill_params())
    out = await p.m.run("p1", PROMPT, 1, kv_transfer_params=marker, adapter="sql")
    handoff = out.chunks[-1].kv_transfer_params
    assert handoff is not None
    d = await make_mocker(block_size=BS, num_gpu_blocks=64, max_loras=1)
    await d.engine.load_adapter("sql", str(tmp_path))
    # The blocks are the adapter's: a decode of the same prompt under the base model
    # refuses them, one under the adapter takes them.
    with pytest.raises(KvTransferFailed, match="another prompt"):
        await d.run("d0", PROMPT, 2, kv_transfer_params=handoff)
    out = await d.run("d1", PROMPT, 2, kv_transfer_params=handoff, adapter="sql")
    assert out.finish == "length" and d.engine.transfers.stats.received_blocks > 0
