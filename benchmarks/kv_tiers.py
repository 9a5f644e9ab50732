"""KV cache tiers on a multi-turn chat whose working set is several times the GPU KV cache.

    python benchmarks/kv_tiers.py [--seconds 40] [--requests 2000] [--arms 0,1,2,3,4,5]
                                  [--out FILE]

For each arm, a fresh deployment (``cluster.py``): one worker process of 4 mocker
instances, each with 320 GPU blocks of 16 tokens (5120 tokens; 20k over the four) on the
real clock (speedup 1: the engines' simulated prefill, onboard and decode times set the
latencies), and a frontend with the ``kv`` router. The load is ``dynamoctl bench``'s
closed loop: 32 users, each in a conversation of 8 turns of 500 new tokens and 8 output
tokens with 4 s of thinking between turns, the history resent every turn, a new
conversation after the last turn. A conversation grows to ~4k tokens (2k on average),
so the 32 live ones hold ~65k tokens: 3-4x the GPU KV cache. Between two turns of one
user the others send ~30 turns, so without a lower tier its history is evicted and
recomputed.

Arms: no tiers; a host-memory tier 4x the GPU pool (GPU + host hold the working set); a
host tier 1x plus a disk tier 8x; both again with the router blind to tiers; and the disk
arm without the disk-offload filter (every block the host evicts is written)
(``--host-tier-credit 0 --disk-tier-credit 0``). Tier bandwidths are the mocker's
defaults (host 25 GB/s, disk 10 GB/s; 128 KiB of KV per token, so 2 MiB per block).
Reported per arm: TTFT p50/p90, throughput, and the prompt blocks found in each tier over
those looked up (the workers' ``dynamoctl_worker_kv_tier_hit_blocks_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
from pathlib import Path
from typing import Any

import httpx
from cluster import MODEL, cluster
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl import wire
from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.stats import Slo, summarize
from dynamoctl.bench.workload import LengthDist, synthetic_sessions
from dynamoctl.discovery import Discovery, store_from_url

WORKERS = 4
GPU_BLOCKS = 320
BASE = ["--num-gpu-blocks", str(GPU_BLOCKS), "--speedup-ratio", "1", "--max-num-seqs", "64"]
HOST = ["--num-host-blocks", str(4 * GPU_BLOCKS)]  # holds the working set with the GPU
SMALL_HOST_DISK = ["--num-host-blocks", str(GPU_BLOCKS), "--num-disk-blocks", str(8 * GPU_BLOCKS)]
NO_FILTER = ["--no-disk-offload-filter"]
BLIND = ["--host-tier-credit", "0", "--disk-tier-credit", "0"]
ARMS: list[tuple[str, list[str], list[str]]] = [
    ("no tiers", [], []),
    ("host 4x", HOST, []),
    ("host 1x + disk 8x", SMALL_HOST_DISK, []),
    ("host 4x, tier-blind router", HOST, BLIND),
    ("host 1x + disk 8x, tier-blind router", SMALL_HOST_DISK, BLIND),
    ("host 1x + disk 8x, no disk filter", SMALL_HOST_DISK + NO_FILTER, []),
]
WORKLOAD = {"concurrency": 32, "turns": 8, "isl": 500, "osl": 8, "think_time_s": 4.0,
            "block_size": 16}  # fmt: skip
ANCHOR = {
    "source": "Dynamo KVBM design document: host offload, 10-turn chat, 80 users",
    "ttft_reduction": 0.40,
}


async def tier_counters(discovery: str) -> dict[str, dict[str, float]]:
    """Per tier, the workers' hit, lookup and onboard block counters summed."""
    async with Discovery(store_from_url(discovery), lease_ttl=2) as disc:
        records = [
            wire.decode_json(raw, wire.InstanceRecord)
            for raw in (await disc.list("bench/instances/worker/")).values()
        ]
    urls = {r.metrics_url for r in records if r.metrics_url}
    totals: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            text = (await http.get(url)).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    name = sample.name.removeprefix("dynamoctl_worker_")
                    if name in ("kv_tier_hit_blocks_total", "kv_lookup_blocks_total",
                                "kv_onboarded_blocks_total"):  # fmt: skip
                        tier = totals.setdefault(sample.labels["tier"], {})
                        tier[name] = tier.get(name, 0.0) + sample.value
    return totals


async def one_arm(name: str, worker_args: list[str], frontend_args: list[str],
                  requests: int, seconds: float) -> dict[str, Any]:  # fmt: skip
    async with cluster(processes=1, per_process=WORKERS, worker_args=BASE + worker_args,
                       router_mode="kv", frontend_args=frontend_args) as deployment:  # fmt: skip
        clock = LoopClock()
        sender = Sender(Endpoint(deployment.url), MODEL, clock, timeout=60)
        sessions = synthetic_sessions(
            LengthDist.parse(str(WORKLOAD["isl"])),
            LengthDist.parse(str(WORKLOAD["osl"])),
            turns=int(WORKLOAD["turns"]),
            seed=1,
        )
        outcome = await drive(sessions, sender.send, clock=clock,
                              limits=Limits(requests, seconds, 30),
                              concurrency=int(WORKLOAD["concurrency"]),
                              think_time=float(WORKLOAD["think_time_s"]))  # fmt: skip
        counters = await tier_counters(deployment.discovery)
    summary = summarize(outcome, Slo(), label=name, concurrency=int(WORKLOAD["concurrency"]))
    lookups = counters.get("gpu", {}).get("kv_lookup_blocks_total", 0.0)
    hits = {
        tier: round(c.get("kv_tier_hit_blocks_total", 0.0) / lookups, 4) if lookups else 0.0
        for tier, c in counters.items()
    }
    onboarded = {t: c.get("kv_onboarded_blocks_total", 0.0) for t, c in counters.items()}
    run = {
        "arm": name,
        "worker_args": BASE + worker_args,
        "frontend_args": frontend_args,
        "requests_sent": summary.requests_sent,
        "completed": summary.completed,
        "errors": summary.errors,
        "error_samples": sorted({f"{r.error}: {r.detail}" for r in outcome.records if r.error})[:3],
        "ttft_ms_p50": summary.ttft_ms.p50,
        "ttft_ms_p90": summary.ttft_ms.p90,
        "request_throughput": summary.request_throughput,
        "output_token_throughput": summary.output_token_throughput,
        "input_token_throughput": summary.input_token_throughput,
        "prefix_hit_by_tier": hits,
        "onboarded_blocks": {t: v for t, v in onboarded.items() if t != "gpu"},
        "lookup_blocks": lookups,
    }
    print(json.dumps(run), flush=True)
    return run


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | TTFT p50 ms | TTFT p90 ms | req/s | hit GPU | hit host | hit disk |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        h = r["prefix_hit_by_tier"]
        lines.append(
            f"| {r['arm']} | {r['ttft_ms_p50']:.0f} | {r['ttft_ms_p90']:.0f} | "
            f"{r['request_throughput']:.1f} | {h.get('gpu', 0):.2f} | {h.get('host', 0):.2f} | "
            f"{h.get('disk', 0):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40.0, help="sending time per arm")
    parser.add_argument("--requests", type=int, default=2000, help="most requests per arm")
    parser.add_argument("--arms", default=",".join(str(i) for i in range(len(ARMS))))
    parser.add_argument("--out", default="benchmarks/results/kv_tiers.json")
    args = parser.parse_args()
    runs = []
    for i in (int(x) for x in args.arms.split(",")):
        name, wargs, fargs = ARMS[i]
        runs.append(asyncio.run(one_arm(name, wargs, fargs, args.requests, args.seconds)))
    print(table(runs))
    base = next((r for r in runs if r["arm"] == "no tiers"), None)
    comparison = {}
    if base is not None:
        for r in runs:
            if r is not base:
                comparison[r["arm"]] = {
                    "ttft_p50_reduction": round(1 - r["ttft_ms_p50"] / base["ttft_ms_p50"], 3),
                    "ttft_p90_reduction": round(1 - r["ttft_ms_p90"] / base["ttft_ms_p90"], 3),
                }
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "deployment": f"1 worker process x {WORKERS} mocker instances ({' '.join(BASE)}, "
        "block 16), 1 frontend (kv router) per arm",
        "workload": WORKLOAD,
        "anchor": ANCHOR,
        "runs": runs,
        "vs_no_tiers": comparison,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
