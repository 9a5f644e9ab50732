"""Fair share under overload (issue 31): an interactive key (8 sessions, short prompts)
beside a batch key (a closed loop of 64, long prompts) on a mocker deployment that the
batch key alone saturates, with fair share (the default) and without it
(``--fifo-admission``).

    python benchmarks/fair_share.py [--rounds 1] [--seconds 20]
                                    [--out benchmarks/results/fair_share.json]

Each arm runs on a fresh deployment (one worker process of ``INSTANCES`` mocker instances
with small KV caches, busy over ``BUSY`` of them: requests beyond wait in the frontend's
admission queue) three phases: interactive alone, batch alone, both at once. Arms
alternate within each round. Reported: the interactive key's TTFT p99 (alone and shared)
and the batch key's completed requests per second (alone and shared); the goal is TTFT
p99 shared within 1.5x of alone and batch throughput shared at least 80 % of alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import MODEL, NS, _frontend_url, _wait_workers
from machine import machine

from dynamoctl.bench.http import Endpoint, get_json_bytes, post_sse

INSTANCES = 2
BLOCKS = 256
BUSY = "0.8"
SPEEDUP = "4"
KEYS = """\
classes:
  interactive: {weight: 8}
  batch: {weight: 1}
keys:
  - {name: chat, key: sk-bench-chat, class: interactive}
  - {name: nightly, key: sk-bench-nightly, class: batch}
"""
SESSIONS, THINK_S, SHORT_WORDS, SHORT_TOKENS = 8, 0.1, 24, 16
LOOP, LONG_WORDS, LONG_TOKENS = 64, 480, 64


class Load:
    """One key's closed-loop clients and what they measured."""

    def __init__(self, endpoint: Endpoint, key: str, words: int, max_tokens: int) -> None:
        self.endpoint, self.words, self.max_tokens = endpoint, words, max_tokens
        self.headers = {"Authorization": f"Bearer {key}"}
        self.done: list[tuple[float, float, float]] = []
        """(start, ttft, end) of every completed request."""
        self.errors = 0

    async def client(self, index: int, stop: float, think: float) -> None:
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            prompt = f"client {index} turn {turn} " + "word " * self.words
            body = {"model": MODEL, "prompt": prompt, "max_tokens": self.max_tokens,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            start = time.monotonic()
            first = None
            try:
                async for _ in post_sse(self.endpoint, "/v1/completions",
                                        json.dumps(body).encode(), self.headers):  # fmt: skip
                    if first is None:
                        first = time.monotonic() - start
            except Exception:  # counted; the loop goes on
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            self.done.append((start, first or 0.0, time.monotonic()))
            if think:
                await asyncio.sleep(think)


def percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


async def phase(url: str, interactive: bool, batch: bool, seconds: float) -> dict[str, Any]:
    warm = 3.0
    t0 = time.monotonic()
    stop = t0 + warm + seconds
    chat = Load(Endpoint(url), "sk-bench-chat", SHORT_WORDS, SHORT_TOKENS)
    bulk = Load(Endpoint(url), "sk-bench-nightly", LONG_WORDS, LONG_TOKENS)
    clients = []
    if interactive:
        clients += [chat.client(i, stop, THINK_S) for i in range(SESSIONS)]
    if batch:
        clients += [bulk.client(1000 + i, stop, 0.0) for i in range(LOOP)]
    await asyncio.gather(*clients)
    begin, end = t0 + warm, stop
    ttfts = [ttft for start, ttft, _ in chat.done if begin <= start <= end]
    finished = [e for _, _, e in bulk.done if begin <= e <= end]
    return {
        "interactive_ttft_p99_ms": percentile_ms(ttfts, 0.99),
        "interactive_ttft_p50_ms": percentile_ms(ttfts, 0.5),
        "interactive_requests": len(ttfts),
        "batch_req_s": round(len(finished) / seconds, 2) if batch else None,
        "errors": chat.errors + bulk.errors,
    }


async def one_arm(fair: bool, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys.yaml").write_text(KEYS)
        discovery = f"embedded://{tmp}/disc"
        common = ["--namespace", NS, "--discovery", discovery]
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamoctl", "worker", "--model", MODEL, "--block-size", "16",
            "--num-workers", str(INSTANCES), "--num-gpu-blocks", str(BLOCKS),
            "--speedup-ratio", SPEEDUP, *common, stderr=asyncio.subprocess.DEVNULL)]  # fmt: skip
        try:
            await _wait_workers(discovery, INSTANCES)
            fargs = ["--port", "0", "--busy-kv-usage", BUSY, "--queue-timeout", "300",
                     "--max-queued", "1024", "--api-keys-file", f"{tmp}/keys.yaml"]  # fmt: skip
            if not fair:
                fargs.append("--fifo-admission")
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dynamoctl", "frontend", *fargs, *common,
                stderr=asyncio.subprocess.DEVNULL))  # fmt: skip
            url = await _frontend_url(discovery)
            headers = {"Authorization": "Bearer sk-bench-chat"}
            for _ in range(600):  # the model is served once the frontend saw a worker
                _, models = await get_json_bytes(Endpoint(url), "/v1/models", headers)
                if MODEL.encode() in models:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)
            alone = await phase(url, True, False, seconds)
            batch = await phase(url, False, True, seconds)
            shared = await phase(url, True, True, seconds)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                await proc.wait()
    return {
        "interactive_ttft_p99_alone_ms": alone["interactive_ttft_p99_ms"],
        "interactive_ttft_p99_shared_ms": shared["interactive_ttft_p99_ms"],
        "batch_req_s_alone": batch["batch_req_s"],
        "batch_req_s_shared": shared["batch_req_s"],
        "phases": {"interactive_alone": alone, "batch_alone": batch, "shared": shared},
    }


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["interactive_ttft_p99_alone_ms", "interactive_ttft_p99_shared_ms",
            "batch_req_s_alone", "batch_req_s_shared"]  # fmt: skip
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = round(sum(values) / len(values), 2) if values else None
    alone, shared = out["interactive_ttft_p99_alone_ms"], out["interactive_ttft_p99_shared_ms"]
    out["ttft_ratio"] = round(shared / alone, 2) if alone and shared else None
    b_alone, b_shared = out["batch_req_s_alone"], out["batch_req_s_shared"]
    out["batch_share"] = round(b_shared / b_alone, 2) if b_alone and b_shared else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="benchmarks/results/fair_share.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"fair": [], "fifo": []}
    for r in range(args.rounds):
        order = ["fair", "fifo"] if r % 2 == 0 else ["fifo", "fair"]
        for arm in order:
            runs[arm].append(asyncio.run(one_arm(arm == "fair", args.seconds)))
            print(arm, json.dumps({k: v for k, v in runs[arm][-1].items() if k != "phases"}))
    result = {
        **mean_of(runs["fair"]),
        "without_fair_share": mean_of(runs["fifo"]),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "deployment": f"1 worker process x {INSTANCES} mocker instances ({BLOCKS} blocks of 16, "
        f"--speedup-ratio {SPEEDUP}); frontend --busy-kv-usage {BUSY}, --queue-timeout 300",
        "workload": f"interactive: {SESSIONS} sessions, ~{SHORT_WORDS + 4}-word prompts, "
        f"{SHORT_TOKENS} tokens, {THINK_S} s think; batch: closed loop of {LOOP}, "
        f"~{LONG_WORDS + 4}-word prompts, {LONG_TOKENS} tokens; classes 8:1; each phase "
        f"{args.seconds} s after 3 s warm-up",
        "rounds": args.rounds,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ttft_ratio", "batch_share")}),
          "without:", json.dumps(result["without_fair_share"]))  # fmt: skip


if __name__ == "__main__":
    main()
