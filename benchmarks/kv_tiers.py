"""KV cache tiers on the workload that needs them: long agent sessions on a 70B model.

    python benchmarks/kv_tiers.py [--seconds 220] [--rounds 2] [--arms none,host,...]

The engine: Llama-3.1-70B (bf16) on 4 x H100 SXM (TP4), timed by AI Configurator
(mocker ``perf-model: aic``, vLLM data): a 32k-token prefill takes ~2.5 s. Its GPU KV
cache is what AI Configurator's memory model gives that layout (454,016 tokens at vLLM's
0.9 memory fraction, 327,680 bytes of KV per token: 80 layers x 8 KV heads x 128 x 2 x 2
bytes), in blocks of 64 tokens. Two such replicas (one worker process), each running at
most 16 sequences, a frontend with the ``kv`` router whose requests wait in the engines'
queues rather than get a 503 (queueing is part of TTFT).

The load: 48 concurrent agent sessions (closed loop). A session starts from 20-30k
tokens of its own context (repository, instructions) and runs 8-20 turns, each adding
1-3k tokens (a tool's output) after 50 output tokens (a tool call), with 3 s of
simulated think time (the tool running) between turns; so it grows to 28-90k tokens.
Steady state, not a cold start: the first 48 sessions are resumed at a uniformly drawn
turn (their earlier turns are their first prompt), and a run is measured from the end
of the last of those first requests (each a cold prefill in every arm; ``warmup_s``).
At steady state the live sessions hold ~1.9M tokens, twice the two GPU caches: without a
lower tier every turn recomputes its whole history.

Rounds: every arm runs once per round, in alternating order (forward, then backward), on
a fresh deployment; TTFTs are pooled over rounds and each round's p50 and req/s are kept
as the spread. TTFTs are in simulated ms (speedup 1: real time; the host's own cost is
measured, not assumed: a probe model on its own idle, near-infinitely fast mocker behind
the same frontend gets a request of the load's median prompt size every 2 s during the
load, and its TTFT is what the host adds to any request at that moment).

Tier bandwidths: one replica is 4 GPUs, each with its own PCIe 5 x16 link and its shard
of the KV heads, so host memory loads at 4 x 25 GB/s (the mocker's per-link default,
docs/mocker.md); the disk tier is half of a DGX H100's 8 NVMe drives in RAID 0 at
~5 GB/s each after the file system (20 GB/s). The router's tier credits are computed for
this engine (``credits``: 0.96 host, 0.79 disk), the tier-blind arm gives it 0.

Arms (same load each): ``none``; ``host`` (3x the GPU cache: the working set fits);
``host_blind`` (the same, router given no tier credit); ``host_small`` (1x, the least a
host tier may be: GPU + host hold about the working set, LRU thrashes); ``host_disk``
(1x host + 6x disk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from cluster import MODEL, cluster
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl import wire
from dynamoctl.bench.client import RequestRecord, Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import percentile
from dynamoctl.bench.workload import Conversation, Session, Turn, random_tokens
from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.kv.tiers import onboard_credit

AIC_MODEL = "meta-llama/Meta-Llama-3.1-70B"
REPLICAS = 2
GPU_TOKENS = 454_016  # AI Configurator: TP4 H100 SXM, vLLM, 0.9 of memory, 32 x 8192
BLOCK = 64
GPU_BLOCKS = GPU_TOKENS // BLOCK
KV_BYTES_PER_TOKEN = 327_680
SPEEDUP = 1.0
HOST_GBPS = 4 * 25.0
DISK_GBPS = 20.0
ENGINE = ["--perf-model", "aic", "--aic-model", AIC_MODEL, "--aic-system", "h100_sxm",
          "--aic-tp-size", "4", "--block-size", str(BLOCK), "--num-gpu-blocks", str(GPU_BLOCKS),
          "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN), "--max-num-seqs", "16",
          "--max-num-batched-tokens", "8192", "--max-model-len", "131072",
          "--speedup-ratio", str(SPEEDUP), "--host-gbps", str(HOST_GBPS),
          "--disk-gbps", str(DISK_GBPS)]  # fmt: skip
# Requests wait in the engines' queues rather than get 503s (a 503 would hide the no-tier
# arm's queueing from TTFT): --busy-kv-usage 1 turns busy-rejection off.
# --stream-silence-timeout 10: a worker process starved of CPU for 1.5 s on this shared
# machine is not a wedged engine (its streams would migrate, then fail: "all excluded").
FRONTEND = ["--busy-kv-usage", "1", "--queue-timeout", "3600", "--max-queued", "1024",
            "--stream-silence-timeout", "10"]  # fmt: skip
BLIND = ["--host-tier-credit", "0", "--disk-tier-credit", "0"]
STAGGER_S = 0.25  # real seconds between the resumed sessions' first requests
HOST_SMALL = GPU_BLOCKS  # the least the mocker takes (a tier holds the one above it)
ARMS: dict[str, tuple[list[str], bool]] = {  # worker args, tier-aware router
    "none": ([], True),
    "host": (["--num-host-blocks", str(3 * GPU_BLOCKS)], True),
    "host_blind": (["--num-host-blocks", str(3 * GPU_BLOCKS)], False),
    "host_small": (["--num-host-blocks", str(HOST_SMALL)], True),
    "host_disk": (["--num-host-blocks", str(HOST_SMALL), "--num-disk-blocks",
                   str(6 * GPU_BLOCKS)], True),
}  # fmt: skip
PROBE = ["--model", "probe", "--perf-model", "polynomial", "--speedup-ratio", "1000000",
         "--num-host-blocks", "0", "--num-disk-blocks", "0"]  # fmt: skip
WORKLOAD: dict[str, Any] = {"sessions": 48, "turns": [8, 20], "context_tokens": [20_000, 30_000],
            "turn_tokens": [1_000, 3_000], "output_tokens": 50, "think_time_s": 3.0,
            "speedup": SPEEDUP}  # fmt: skip
PROBE_TOKENS = 40_000  # about the load's median prompt
CREDIT_AT_TOKENS = 32_768  # the prefill rate the router's tier credits are computed at
ANCHOR = {
    "source": "Dynamo KVBM design document: host offload on multi-turn chat",
    "ttft_reduction": 0.40,
}


def agent_sessions(seed: int) -> Iterator[Session]:
    """Endless agent sessions (see the module docstring); the same ones for every arm.

    The first ``sessions`` are resumed at a uniformly drawn turn (their earlier turns'
    tokens, a tool call of ``output_tokens`` each included, are their first prompt), so
    that the run starts with sessions at every age, as a steady state has them."""
    rng = random.Random(seed)
    w = WORKLOAD
    index = 0
    while True:
        context = random_tokens(rng, rng.randint(*w["context_tokens"]))
        turns = [
            Turn(random_tokens(rng, rng.randint(*w["turn_tokens"])), int(w["output_tokens"]))
            for _ in range(rng.randint(*w["turns"]))
        ]
        if index < int(w["sessions"]):
            done = rng.randrange(len(turns))
            for turn in turns[:done]:
                context += turn.new_tokens + random_tokens(rng, turn.max_tokens)
            turns = turns[done:]
        yield Session(index, context, turns)
        index += 1


async def tier_counters(discovery: str) -> dict[str, dict[str, float]]:
    """Per tier, the load model's hit, lookup and onboard block counters summed."""
    async with Discovery(store_from_url(discovery), lease_ttl=2) as disc:
        records = [
            wire.decode_json(raw, wire.InstanceRecord)
            for raw in (await disc.list("bench/instances/worker/")).values()
        ]
    urls = {r.metrics_url for r in records if r.metrics_url}
    totals: dict[str, dict[str, float]] = {}
    wanted = ("kv_tier_hit_blocks_total", "kv_lookup_blocks_total", "kv_onboarded_blocks_total")
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            for family in text_string_to_metric_families((await http.get(url)).text):
                for sample in family.samples:
                    name = sample.name.removeprefix("dynamoctl_worker_")
                    if name in wanted and sample.labels.get("model") == MODEL:
                        tier = totals.setdefault(sample.labels["tier"], {})
                        tier[name] = tier.get(name, 0.0) + sample.value
    return totals


async def probe(url: str, stop: asyncio.Event) -> list[float]:
    """TTFTs (real seconds) of the probe model, one request every 2 s until ``stop``."""
    clock = LoopClock()
    sender = Sender(Endpoint(url), "probe", clock, timeout=120)
    tokens = random_tokens(random.Random("probe"), PROBE_TOKENS)
    ttfts: list[float] = []
    while not stop.is_set():
        conv = Conversation(Session(0, tokens, [Turn([1], 1)]), "completions", False)
        record = await sender.send(conv, clock.now())
        if record.ttft is not None and record.error is None:
            ttfts.append(record.ttft)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)
    return ttfts[1:]  # the first one computed its prompt


def prefill_ms_table() -> Any:
    """The simulated prefill time of ``n`` uncached tokens on the benchmark's engine."""
    from dynamoctl.configure import aic
    from dynamoctl.configure.models import Parallel

    return aic.step_latency(AIC_MODEL, "h100_sxm", "vllm", None, Parallel(tp=4)).prefill_ms


def credits(prefill_ms: Any) -> list[str]:
    """The router's tier credits for this engine (docs/router.md, "Tiers"): a 70B block
    costs ~2.5x an 8B one to move but ~9x to recompute, so the 8B-based defaults
    (0.65 host, 0.14 disk) undervalue a hit here."""
    per_token = prefill_ms(CREDIT_AT_TOKENS) / CREDIT_AT_TOKENS
    block_bytes = BLOCK * KV_BYTES_PER_TOKEN
    host = onboard_credit(block_bytes, HOST_GBPS, per_token, BLOCK)
    disk = onboard_credit(block_bytes, DISK_GBPS, per_token, BLOCK)
    return ["--host-tier-credit", f"{host:.3f}", "--disk-tier-credit", f"{disk:.3f}"]


def measured(records: list[RequestRecord], sessions: int) -> tuple[list[RequestRecord], float]:
    """The requests sent after the warm-up, and when it ended: once every resumed
    session's first request (a cold prefill in every arm) has ended."""
    firsts = [r.start + (r.e2e or 0.0) for r in records if r.turn == 0 and r.session < sessions]
    warm = max(firsts, default=0.0)
    return [r for r in records if r.start >= warm], warm


def arm_run(records: list[RequestRecord], probe_ttfts: list[float],
            counters: dict[str, dict[str, float]], seconds: float,
            prefill_ms: Any) -> dict[str, Any]:  # fmt: skip
    """One run of one arm: its raw figures, pooled over rounds by :func:`pooled`."""
    after, warm = measured(records, int(WORKLOAD["sessions"]))
    ok = [r for r in after if r.error is None and r.ttft is not None]
    # Each request's own simulated prefill (its uncached tokens), over its TTFT.
    own = [
        prefill_ms(max(1, (r.prompt_tokens or 0) - (r.cached_tokens or 0)))
        / (r.ttft * 1e3 * SPEEDUP)
        for r in ok
        if r.ttft
    ]
    return {
        "ttfts_ms": [round(r.ttft * 1e3 * SPEEDUP, 1) for r in ok if r.ttft is not None],
        "measured_s": (seconds - warm) * SPEEDUP,
        "warmup_s": round(warm * SPEEDUP, 1),
        "errors": dict(Counter(r.error for r in after if r.error is not None)),
        "error_samples": sorted({f"{r.error}: {r.detail}" for r in after if r.error})[:3],
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "prompt_tokens": [r.prompt_tokens or 0 for r in ok],
        "own_prefill_share": own,
        "probe_ms": [t * 1e3 * SPEEDUP for t in probe_ttfts],
        "counters": counters,
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's figures over all its rounds (TTFTs pooled; per-round p50s as the spread)."""
    ttfts = sorted(t for run in runs for t in run["ttfts_ms"])
    counters: dict[str, dict[str, float]] = {}
    for run in runs:
        for tier, c in run["counters"].items():
            mine = counters.setdefault(tier, {})
            for k, v in c.items():
                mine[k] = mine.get(k, 0.0) + v
    lookups = counters.get("gpu", {}).get("kv_lookup_blocks_total", 0.0)
    prompts = [p for run in runs for p in run["prompt_tokens"]]
    own = [x for run in runs for x in run["own_prefill_share"]]
    probe_ms = [x for run in runs for x in run["probe_ms"][1:]]  # first: its own prefill
    p50 = percentile(ttfts, 0.5) if ttfts else 0.0
    host_ms = statistics.median(probe_ms) if probe_ms else None
    cached = sum(r["cached_tokens"] for r in runs)
    per_round = [percentile(sorted(r["ttfts_ms"]), 0.5) for r in runs if r["ttfts_ms"]]
    return {
        "ttft_p50_ms": round(p50, 1),
        "ttft_p90_ms": round(percentile(ttfts, 0.9), 1) if ttfts else 0.0,
        "ttft_p99_ms": round(percentile(ttfts, 0.99), 1) if ttfts else 0.0,
        "req_s": round(len(ttfts) / sum(r["measured_s"] for r in runs), 3),
        "hits": {
            tier: round(c.get("kv_tier_hit_blocks_total", 0.0) / lookups, 4) if lookups else 0.0
            for tier, c in sorted(counters.items())
        },
        "completed": len(ttfts),
        "rounds_ttft_p50_ms": [round(x, 1) for x in per_round],
        "rounds_req_s": [round(len(r["ttfts_ms"]) / r["measured_s"], 3) for r in runs],
        "warmup_s": [r["warmup_s"] for r in runs],
        "errors": [r["errors"] for r in runs],
        "error_samples": sorted({e for r in runs for e in r["error_samples"]})[:3],
        "cached_token_share": round(cached / max(1, sum(prompts)), 4),
        "mean_prompt_tokens": round(statistics.mean(prompts)) if prompts else 0,
        "own_prefill_share_of_ttft_p50": round(statistics.median(own), 3) if own else None,
        "host_overhead_ms_p50": round(host_ms, 1) if host_ms is not None else None,
        "host_overhead_share_of_ttft_p50": round(host_ms / p50, 4) if host_ms and p50 else None,
        "onboarded_blocks": {
            t: c.get("kv_onboarded_blocks_total", 0.0) for t, c in counters.items() if t != "gpu"
        },
    }


async def one_arm(name: str, seconds: float, prefill_ms: Any) -> dict[str, Any]:
    worker_args, aware = ARMS[name]
    frontend_args = FRONTEND + (credits(prefill_ms) if aware else BLIND)
    async with cluster(per_process=REPLICAS, worker_args=ENGINE + worker_args,
                       process_args=[[], PROBE], router_mode="kv",
                       frontend_args=frontend_args) as deployment:  # fmt: skip
        clock = LoopClock()
        sender = Sender(Endpoint(deployment.url), MODEL, clock, timeout=900)

        async def send(conv: Conversation, origin: float) -> RequestRecord:
            first = conv.turn == 0 and conv.session.id < int(WORKLOAD["sessions"])
            if first:  # not every session's cold start at once
                await asyncio.sleep(conv.session.id * STAGGER_S)
            return await sender.send(conv, origin)

        stop = asyncio.Event()
        probing = asyncio.create_task(probe(deployment.url, stop))
        load_before = os.getloadavg()[0]
        outcome = await drive(agent_sessions(seed=1), send, clock=clock,
                              limits=Limits(100_000, seconds, 20),
                              concurrency=int(WORKLOAD["sessions"]),
                              think_time=float(WORKLOAD["think_time_s"]) / SPEEDUP)  # fmt: skip
        stop.set()
        probe_ttfts = await probing
        counters = await tier_counters(deployment.discovery)
    run = arm_run(outcome.records, probe_ttfts, counters, seconds, prefill_ms)
    run["unfinished"] = outcome.unfinished
    run["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    run["frontend_args"] = frontend_args
    brief = {k: v for k, v in pooled([run]).items() if k not in ("errors",)}
    print(name, json.dumps(brief), flush=True)
    return run


def goals(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, checked from the file's own figures."""

    def lower(a: str, b: str, key: str) -> float | None:
        if a not in arms or b not in arms:
            return None
        return round(1 - float(arms[a][key]) / float(arms[b][key]), 3)

    out: dict[str, Any] = {
        "host_vs_none_p50": lower("host", "none", "ttft_p50_ms"),
        "host_vs_none_p90": lower("host", "none", "ttft_p90_ms"),
        "aware_vs_blind_p50": lower("host", "host_blind", "ttft_p50_ms"),
        "aware_vs_blind_p90": lower("host", "host_blind", "ttft_p90_ms"),
        "disk_vs_host_small_p50": lower("host_disk", "host_small", "ttft_p50_ms"),
        "disk_vs_host_small_p90": lower("host_disk", "host_small", "ttft_p90_ms"),
    }
    if "host" in arms and "none" in arms:
        out["host_vs_none_req_s_ratio"] = round(arms["host"]["req_s"] / arms["none"]["req_s"], 3)
    return out


def plot(arms: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(arms)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    for i, key in enumerate(("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms")):
        xs = [j + (i - 1) * width for j in range(len(names))]
        ax.bar(xs, [arms[n][key] / 1e3 for n in names], width, label=key[5:8])
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("TTFT, simulated s")
    sessions = WORKLOAD["sessions"]
    ax.set_title(f"KV tiers: Llama-3.1-70B TP4 H100 (AI Configurator), {sessions} agent sessions")
    ax.legend()
    fig.text(0.01, 0.01, "2 replicas, 454k-token GPU KV each; sessions 20-30k + 8-20 turns of "
             "1-3k; host 100 GB/s, disk 20 GB/s; steady state", fontsize=8)  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=200.0, help="real sending time per arm")
    parser.add_argument("--rounds", type=int, default=2, help="arms alternate across rounds")
    parser.add_argument("--backward", action="store_true", help="first round in reverse order")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="benchmarks/results/kv_tiers.json")
    args = parser.parse_args()
    prefill_ms = prefill_ms_table()
    names = args.arms.split(",")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names if (rnd + args.backward) % 2 == 0 else names[::-1]:
            try:
                run = asyncio.run(one_arm(name, args.seconds, prefill_ms))
            except TimeoutError as exc:  # a deployment that did not start on a loaded host
                print(f"{name}: {exc}; once more", flush=True)
                run = asyncio.run(one_arm(name, args.seconds, prefill_ms))
            runs[name].append(run)
            write(Path(args.out), args, runs, prefill_ms)  # as each run ends: the run is long


def write(out: Path, args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
          prefill_ms: Any) -> None:  # fmt: skip
    arms = {name: pooled(r) for name, r in runs.items() if r}
    loads = [x for r in runs.values() for run in r for x in run["load_average"]]
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_min_max": [min(loads), max(loads)] if loads else None,
        },
        "command": f"python benchmarks/kv_tiers.py --seconds {args.seconds:g} "
        f"--rounds {args.rounds} --arms {args.arms}",
        "engine": {
            "aic_model": AIC_MODEL,
            "system": "h100_sxm",
            "tp": 4,
            "replicas": REPLICAS,
            "gpu_kv_tokens": GPU_TOKENS,
            "block_size": BLOCK,
            "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
            "host_gbps": HOST_GBPS,
            "disk_gbps": DISK_GBPS,
            "prefill_ms_32k": round(prefill_ms(CREDIT_AT_TOKENS), 1),
            "router_tier_credits": credits(prefill_ms),
        },
        "workload": WORKLOAD,
        "arm_worker_args": {name: ARMS[name][0] for name in runs},
        "seconds_per_arm": args.seconds,
        "rounds": args.rounds,
        "warmup": "until every resumed session's first request ended (per run, warmup_s)",
        "req_s_unit": "completed requests per simulated second, after the warm-up",
        "ttft_unit": "simulated ms (real ms x speedup), pooled over rounds",
        "anchor": ANCHOR,
        "arms": arms,
        "runs": {
            name: [
                {
                    k: v
                    for k, v in run.items()
                    if k not in ("ttfts_ms", "prompt_tokens", "own_prefill_share", "probe_ms")
                }
                for run in r
            ]
            for name, r in runs.items()
        },
        "goals": goals(arms),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(arms, out.with_suffix(".png"))
    print(json.dumps(result["goals"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
