"""A real ``dynamoctl worker --engine mocker`` with a host tier: an evicted prompt comes
back from host memory, and ``/metrics`` shows each tier's usage, traffic and hit rate."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from dynamoctl.planes.request import RequestClient
from dynamoctl.wire.engine import GenerateRequest
from tests.worker.test_worker_process import (
    BLOCK,
    BLOCKS,
    generate,
    start_worker,
    stop,
    wait_registered,
)

pytestmark = pytest.mark.kv_tiers


def series(metrics: str, name: str, tier: str) -> float:
    match = re.search(rf'^{name}{{[^}}]*tier="{tier}"[^}}]*}} (\S+)$', metrics, re.M)
    assert match is not None, f"{name}{{tier={tier}}} not exported"
    return float(match.group(1))


async def test_worker_onboards_from_host_and_exports_tier_metrics(tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "--num-host-blocks", str(4 * BLOCKS), "--speedup-ratio", "100")
    try:
        worker = await wait_registered(f"embedded://{tmp_path}", proc)
        assert worker.record.metrics_url is not None
        first = [7000 + i for i in range(10 * BLOCK + 1)]
        async with RequestClient() as client:
            address = worker.record.address
            await generate(client, address, GenerateRequest("a", first, 1))
            for i in range(BLOCKS // 40 + 2):  # more distinct prompts than the GPU holds
                filler = [100_000 * (i + 1) + t for t in range(40 * BLOCK)]
                await generate(client, address, GenerateRequest(f"f{i}", filler, 1))
            again = await generate(client, address, GenerateRequest("a2", first, 1))
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(worker.record.metrics_url)).text
    finally:
        stop(proc)
    assert again[0].cached_tokens == 10 * BLOCK  # every full block, from host memory
    assert series(metrics, "dynamoctl_worker_kv_onboarded_blocks_total", "host") == 10
    assert series(metrics, "dynamoctl_worker_kv_tier_capacity_blocks", "host") == 4 * BLOCKS
    assert series(metrics, "dynamoctl_worker_kv_tier_blocks", "host") > 0
    assert series(metrics, "dynamoctl_worker_kv_tier_hit_blocks_total", "host") == 10
    lookups = series(metrics, "dynamoctl_worker_kv_lookup_blocks_total", "host")
    assert series(metrics, "dynamoctl_worker_kv_tier_hit_rate", "host") == pytest.approx(
        10 / lookups
    )
    assert series(metrics, "dynamoctl_worker_kv_tier_full", "host") == 0
