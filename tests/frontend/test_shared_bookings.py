"""Embedded routers of two frontends share their bookings (``--share-bookings``): real
mocker workers and discovery, the routers in this process, so each pick is known.

Two frontends route the same new prompt at once: with shared bookings the second sees the
first's request on its worker and spreads; each alone would see two idle workers and pick
one at random (a 1 in 2 chance per round of the same worker: 6 rounds fail 63 times in 64).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.frontend.routing import EmbeddedRouting, SharedPicker
from dynamoctl.router.settings import RouterSettings
from dynamoctl.wire.engine import ModelCard
from tests.frontend.conftest import BLOCK, MODEL, NS, START_S, Deployment

pytestmark = pytest.mark.timeout(2 * START_S)

CARD = ModelCard(
    model=MODEL, tokenizer=MODEL, block_size=BLOCK, kv_capacity_blocks=1024, max_num_seqs=64,
    max_num_batched_tokens=8192, context_length=8192,
)  # fmt: skip


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_two_frontends_routing_one_prefix_at_once_spread_it(tmp_path: Path) -> None:
    dep = Deployment(tmp_path)
    try:
        dep.worker("--num-workers", "2", "--speedup-ratio", "20")
        await dep.wait_for("worker", 2)
        store = store_from_url(dep.discovery_url)
        async with Discovery(store, lease_ttl=2) as disc:
            fronts = [EmbeddedRouting(disc, NS, RouterSettings(mode="kv")) for _ in range(2)]
            for i, front in enumerate(fronts):
                front.share_bookings(f"front{i}", "127.0.0.1")
                await front.start()
            pickers = []
            try:
                pickers += [await f.make_picker(MODEL, CARD) for f in fronts]
                a, b = pickers
                assert isinstance(a, SharedPicker) and isinstance(b, SharedPicker)
                await until(lambda: len(a.pools.main.router.workers()) == 2, START_S)
                await until(lambda: len(b.pools.main.router.workers()) == 2, START_S)
                sync_a, sync_b = a.bookings, b.bookings
                await until(lambda: sync_a.peers() == ["front1"] and sync_b.peers() == ["front0"])
                for turn in range(6):
                    prompt = [turn * 1000 + t for t in range(4 * BLOCK + 3)]
                    first = await a.pick(prompt, f"a{turn}", set())
                    await until(lambda: sync_b.peer_total() == 1)
                    second = await b.pick(prompt, f"b{turn}", set())
                    assert second.worker_id != first.worker_id, f"turn {turn}"
                    a.first_token(f"a{turn}")
                    a.finished(f"a{turn}")
                    b.finished(f"b{turn}")
                    await until(lambda: sync_a.peer_total() == 0 and sync_b.peer_total() == 0)
                    assert len(a.pools.main.router.load) == len(b.pools.main.router.load) == 0
            finally:
                for picker in pickers:
                    await picker.close()
                for front in fronts:
                    await front.close()
    finally:
        dep.stop()
