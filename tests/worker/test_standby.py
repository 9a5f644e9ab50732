"""A warm spare's worker side: on standby it registers only its standby record (no
instance record, model card or events record for routers to find) and says ``standby`` in
``/health``; the supervisor's promotion key makes it register as a worker, and a promotion
key of another instance does nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.engines.mocker import MockerConfig, MockerEngine
from dynamoctl.worker.http import worker_health
from dynamoctl.worker.instance import WorkerInstance
from dynamoctl.worker.standby import promote_when_asked

pytestmark = pytest.mark.fast_start


async def test_standby_until_its_own_promotion(tmp_path: Path) -> None:
    engine = MockerEngine(MockerConfig(model="m", block_size=16, num_gpu_blocks=64))
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as disc:
        inst = WorkerInstance(engine, disc, namespace="ns", instance_id="w-0", label="agg-1")
        await inst.start(standby=True)
        try:
            listed = set(await disc.list("ns/"))
            assert listed == {inst.standby_key}
            assert worker_health([inst], True).status == "standby"
            promotion = asyncio.create_task(promote_when_asked(disc, "ns", [inst]))
            await disc.put(keys.promote_key("ns", "w-1"), b"promote")  # another's: ignored
            await asyncio.sleep(0.5)
            assert not promotion.done() and inst.standby
            await disc.put(keys.promote_key("ns", "w-0"), b"promote")
            await asyncio.wait_for(promotion, 10)
            listed = set(await disc.list("ns/instances/"))
            assert listed == {inst.instance_key}
            assert inst.model_key in await disc.list("ns/models/")
            assert inst.events_key in await disc.list("ns/events/")
            assert worker_health([inst], True).status == "ready" and not inst.standby
        finally:
            await inst.close()
