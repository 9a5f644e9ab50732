"""A draining prefill worker keeps serving its pinned hand-offs: the decode that pulls
during the drain gets the KV, and the drain ends once nothing is left to pull."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.engines.api import GenerateRequest, HoldsPeerWork
from dynamoctl.engines.mocker import MockerConfig, MockerEngine
from dynamoctl.planes.request import RequestClient
from dynamoctl.wire import engine as wire_engine
from dynamoctl.worker.instance import GENERATE, WorkerInstance
from tests.engines.conftest import Harness

PROMPT = list(range(3000, 3100))


async def test_drain_waits_until_decodes_pulled_the_pinned_prefills(tmp_path: Path) -> None:
    config = MockerConfig(model="m", block_size=16, num_gpu_blocks=64, speedup_ratio=50)
    engine = MockerEngine(config)
    assert isinstance(engine, HoldsPeerWork)
    decode = Harness(block_size=16, num_gpu_blocks=64)
    await decode.engine.start()
    client = RequestClient()
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as disc:
        inst = WorkerInstance(engine, disc, namespace="ns", role="prefill", host="127.0.0.1")
        await inst.start()
        try:
            body = wire_engine.encode(GenerateRequest("p1", PROMPT, 1))
            chunks = [
                wire_engine.decode_chunk(raw)
                async for raw in client.stream(inst.server.address, GENERATE, body)
            ]
            handoff = chunks[-1].kv_transfer_params
            assert handoff is not None and engine.pending_peer_work() == 1

            drain = asyncio.create_task(inst.drain(grace=30))
            await asyncio.sleep(0.3)
            assert not drain.done(), "the drain ended with a hand-off still pinned"
            # The pull is served during the drain: the decode computes no prompt.
            out = await decode.run("d1", PROMPT, 4, kv_transfer_params=handoff)
            assert out.finish == "length" and len(out.tokens) == 4
            assert decode.engine.stats.prefill_tokens == 0
            assert await asyncio.wait_for(drain, 10) == 0
            assert engine.pending_peer_work() == 0 and engine.transfers.stats.pulled == 1
        finally:
            await inst.close()
            await client.close()
            await decode.engine.stop()


async def test_drain_gives_up_on_unpulled_handoffs_at_the_grace(tmp_path: Path) -> None:
    engine = MockerEngine(MockerConfig(model="m", block_size=16, num_gpu_blocks=64))
    client = RequestClient()
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as disc:
        inst = WorkerInstance(engine, disc, namespace="ns", role="prefill", host="127.0.0.1")
        await inst.start()
        try:
            body = wire_engine.encode(GenerateRequest("p1", PROMPT, 1))
            async for _ in client.stream(inst.server.address, GENERATE, body):
                pass
            assert engine.pending_peer_work() == 1
            assert await asyncio.wait_for(inst.drain(grace=0.2), 10) == 0
            assert engine.pending_peer_work() == 1  # nobody pulled: close() drops it
        finally:
            await inst.close()
            await client.close()
    assert engine.pending_peer_work() == 0
