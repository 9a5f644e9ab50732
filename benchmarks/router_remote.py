"""What asking a standalone router costs, against the embedded one.

    python benchmarks/router_remote.py [--picks 2000] [--out FILE]

Starts one worker process (4 mocker instances, B=16) and one ``dynamoctl router`` on
127.0.0.1 with embedded discovery. In this process (uvloop, as the frontend runs) it
builds both pickers the frontend can have over the same workers, the embedded one (an
in-process ModelPools) and the standalone one (RemotePicker over RouterReplicas), and
times ``pick`` + ``finished`` for 1024-token prompts: sequentially (latency) and with 32
picks in flight (throughput, the router process's CPU per pick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.frontend.remote import RemotePicker
from dynamoctl.frontend.routing import EmbeddedPicker
from dynamoctl.router import KvRouter
from dynamoctl.router.pools import ModelPools
from dynamoctl.router.standalone.client import RouterReplicas
from dynamoctl.util import aio

NS = "bench"
MODEL = "mock-llama"
BLOCK = 16


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(picker: EmbeddedPicker | RemotePicker, prompts: list[list[int]], tag: str,
                  router_proc: psutil.Process | None) -> dict[str, float]:  # fmt: skip
    latencies = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        await picker.pick(prompt, f"{tag}-{i}", set())
        latencies.append(time.perf_counter() - t0)
        picker.finished(f"{tag}-{i}")
    cpu0 = router_proc.cpu_times() if router_proc else None
    began = time.perf_counter()
    queue = list(enumerate(prompts))

    async def client() -> None:
        while queue:
            i, prompt = queue.pop()
            await picker.pick(prompt, f"{tag}-c{i}", set())
            picker.finished(f"{tag}-c{i}")

    await asyncio.gather(*(client() for _ in range(32)))
    wall = time.perf_counter() - began
    row = {
        "p50_us": round(statistics.median(latencies) * 1e6, 1),
        "p99_us": round(pct(latencies, 0.99) * 1e6, 1),
        "picks_per_s_at_32": round(len(prompts) / wall),
    }
    if router_proc is not None and cpu0 is not None:
        cpu1 = router_proc.cpu_times()
        used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        row["router_cpu_us_per_pick"] = round(used * 1e6 / len(prompts), 1)
    return row


async def run(url: str, router_pid: int, picks: int) -> dict[str, dict[str, float]]:
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 8000) for _ in range(1024)] for _ in range(picks)]
    async with Discovery(store_from_url(url), lease_ttl=2) as disc:
        for _ in range(300):
            if await disc.list(f"{NS}/instances/router/"):
                break
            await asyncio.sleep(0.1)
        pools = await ModelPools.open(disc, NS, MODEL, lambda: KvRouter("kv", BLOCK))
        replicas = RouterReplicas(disc, NS)
        try:
            async with replicas:
                await pools.main.wait_for_workers(4)
                for _ in range(100):
                    if replicas.replicas():
                        break
                    await asyncio.sleep(0.05)
                embedded = await measure(EmbeddedPicker(pools), prompts, "e", None)
                remote = RemotePicker(MODEL, replicas)
                await remote.pick(prompts[0], "warm", set())
                remote.finished("warm")
                standalone = await measure(remote, prompts, "s", psutil.Process(router_pid))
        finally:
            await pools.close()
    return {"embedded": embedded, "standalone": standalone}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/results/router_remote.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"embedded://{tmp}"
        common = ["--namespace", NS, "--discovery", url]
        worker = ["worker", "--num-workers", "4", "--model", MODEL, "--block-size", str(BLOCK),
                  "--speedup-ratio", "1000"]  # fmt: skip
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "dynamoctl", *argv, *common], stderr=subprocess.DEVNULL
            )
            for argv in (worker, ["router"])
        ]
        try:
            rows = aio.run(run(url, procs[1].pid, args.picks))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(15)
    for name, row in rows.items():
        print(f"{name:<10} {row}")
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "workload": f"{args.picks} picks of 1024-token prompts, B={BLOCK}, 4 mocker workers",
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
