"""Router benchmark: the request-path cost of KV-aware routing, and KV event ingestion.

    python benchmarks/router.py [--out results.json]

No processes, no sockets: the pure :class:`KvRouter` on synthetic caches. Every worker
holds a random-depth prefix of the measured prompt plus thousands of unrelated blocks
(stored with engine hashes that differ from ours, as vLLM's do). Ingestion is measured
both ways: blocks named by the engine's own hashes (vLLM: the router hashes each block's
tokens) and by ours (the mocker: the router checks the first block of each event only).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import psutil
from machine import machine

from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.router import KvRouter
from dynamoctl.wire.kv_events import BlockStored, KVEventBatch

VOCAB = 32000


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def populated(
    rng: random.Random,
    workers: int,
    blocks: int,
    block_size: int,
    prompt: list[int],
    ours: bool = False,
) -> tuple[KvRouter, float]:
    """A kv router whose workers cache ``blocks`` blocks each; returns it and the event
    ingestion rate in blocks per second. ``ours``: the events name blocks by our hashes."""

    def names(tokens: list[int]) -> list[int]:
        if ours:
            return sequence_hashes(tokens, block_size)
        return [rng.getrandbits(64) for _ in range(len(tokens) // block_size)]

    router = KvRouter("kv", block_size, seed=0)
    batches: list[tuple[str, KVEventBatch]] = []
    chain = 32  # blocks per BlockStored, like a prompt's worth of prefill
    for w in range(workers):
        name = f"w{w}"
        router.add_worker(name)
        depth = rng.randrange(len(prompt) // block_size + 1)
        events = []
        if depth:
            toks = prompt[: depth * block_size]
            events.append(BlockStored(names(toks), None, toks, block_size))
        for _ in range(blocks // chain):
            toks = [rng.randrange(VOCAB) for _ in range(chain * block_size)]
            events.append(BlockStored(names(toks), None, toks, block_size))
        batches.append((name, KVEventBatch(0.0, events)))
    stored = sum(
        len(e.block_hashes) for _, b in batches for e in b.events if isinstance(e, BlockStored)
    )
    t0 = time.perf_counter()
    for name, batch in batches:
        router.apply_kv_batch(name, batch)
    return router, stored / (time.perf_counter() - t0)


def measure(workers: int, blocks: int, isl: int, block_size: int, rounds: int) -> dict[str, float]:
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(isl)]
    _, ingest_ours = populated(random.Random(1), workers, blocks, block_size, prompt, ours=True)
    router, ingest = populated(rng, workers, blocks, block_size, prompt)
    rss = psutil.Process().memory_info().rss  # the process holding this case's router
    hashes = sequence_hashes(prompt, block_size)
    hash_t, match_t, pick_t = [], [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        sequence_hashes(prompt, block_size)
        t1 = time.perf_counter()
        router.index.find_matches(hashes)
        t2 = time.perf_counter()
        router.pick(prompt, f"r{i}")
        t3 = time.perf_counter()
        router.on_finished(f"r{i}")
        hash_t.append(t1 - t0)
        match_t.append(t2 - t1)
        pick_t.append(t3 - t2)
    us = 1e6
    return {
        "workers": workers,
        "blocks_per_worker": blocks,
        "isl": isl,
        "block_size": block_size,
        "ingest_blocks_per_s": round(ingest),
        "ingest_our_named_blocks_per_s": round(ingest_ours),
        "ingest_our_named_over_engine_named": round(ingest_ours / ingest, 2),
        "hash_prompt_us_p50": round(statistics.median(hash_t) * us, 1),
        "find_matches_us_p50": round(statistics.median(match_t) * us, 1),
        "find_matches_us_p99": round(pct(match_t, 0.99) * us, 1),
        "pick_us_p50": round(statistics.median(pick_t) * us, 1),
        "pick_us_p99": round(pct(pick_t, 0.99) * us, 1),
        "process_rss_gib": round(rss / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "router.json"
    )
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument(
        "--cases",
        default="128x8192x4096x16,128x4096x4096x16,128x4096x4096x64,16x4096x1024x64",
        help="WORKERSxBLOCKSxISLxBLOCK_SIZE,...; 128x8192 is the 1M-cached-block case",
    )
    args = parser.parse_args()
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    measured = [measure(*case, rounds=args.rounds) for case in cases]
    results = {"machine": machine(), "cases": measured}
    print(
        f"{'workers':>7} {'blocks':>6} {'isl':>5} {'B':>3} {'ingest/s':>9} {'ours/s':>9} "
        f"{'hash':>7} {'match p50/p99':>14} {'pick p50/p99':>14}"
    )
    for c in results["cases"]:
        print(
            f"{c['workers']:>7} {c['blocks_per_worker']:>6} {c['isl']:>5} {c['block_size']:>3} "
            f"{c['ingest_blocks_per_s']:>9} {c['ingest_our_named_blocks_per_s']:>9} "
            f"{c['hash_prompt_us_p50']:>6}µ "
            f"{c['find_matches_us_p50']:>6}/{c['find_matches_us_p99']:<6}µ "
            f"{c['pick_us_p50']:>6}/{c['pick_us_p99']:<6}µ"
        )
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
