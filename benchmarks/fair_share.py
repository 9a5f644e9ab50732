"""Fair share under overload (issue 31): an interactive key (8 sessions, short prompts)
beside a batch key (a closed loop of 64, long prompts) on a mocker deployment that the
batch key alone saturates, with fair share (the fair queue, the batch class's headroom
and the interactive class's priority in the engines, the default), without the engines'
priority, without headroom, and without any (``--fifo-admission``).

    python benchmarks/fair_share.py [--rounds 1] [--seconds 20] [--arms ...]
                                    [--out benchmarks/results/fair_share.json]

Each arm runs on a fresh deployment (one worker process of ``INSTANCES`` mocker instances
with small KV caches, busy over ``BUSY`` of them: requests beyond wait in the frontend's
admission queue) three phases: interactive alone, batch alone, both at once. Arms
alternate within each round. Reported: the interactive key's TTFT p50, p90 and p99
(alone and shared) over every request of every round of an arm pooled, with their
counts, and the batch key's completed requests per second (alone and shared); the goal
is TTFT p99 shared within 1.5x of alone and batch throughput shared at least 80 % of
alone. The alone phase runs the same thing in every arm (no batch: no queue, headroom
or priority in play), so its samples of all arms pooled are the baseline each arm's
shared p99 is also divided by (``ttft_ratio_of_pooled_alone``).
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
HEADROOM = 0.15
KEYS = """\
classes:
  interactive: {weight: 8, priority: %d}
  batch: {weight: 1, headroom: %s}
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


def tail(values: list[float]) -> dict[str, Any]:
    """p50, p90, p99 in ms of TTFTs in seconds, and how many there were (a p99 over n
    requests is the n/100-th largest)."""
    return {"p50_ms": percentile_ms(values, 0.5), "p90_ms": percentile_ms(values, 0.9),
            "p99_ms": percentile_ms(values, 0.99), "requests": len(values)}  # fmt: skip


async def phase(url: str, interactive: bool, batch: bool, seconds: float) -> dict[str, Any]:
    """One phase; the batch key's clients run in a process of their own (as another
    user's script would), so that its 64 streams do not delay the interactive clients'
    reading of their first tokens."""
    warm = 3.0
    t0 = time.monotonic()
    stop = t0 + warm + seconds
    chat = Load(Endpoint(url), "sk-bench-chat", SHORT_WORDS, SHORT_TOKENS)
    bulk_proc = None
    if batch:
        bulk_proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--batch-load", url, "--batch-stop", str(stop),
            stdout=asyncio.subprocess.PIPE)  # fmt: skip
    if interactive:
        await asyncio.gather(*(chat.client(i, stop, THINK_S) for i in range(SESSIONS)))
    bulk_done: list[list[float]] = []
    bulk_errors = 0
    if bulk_proc is not None:
        out, _ = await bulk_proc.communicate()
        report = json.loads(out)
        bulk_done, bulk_errors = report["done"], report["errors"]
    begin, end = t0 + warm, stop
    ttfts = [ttft for start, ttft, _ in chat.done if begin <= start <= end]
    finished = [e for _, _, e in bulk_done if begin <= e <= end]
    return {
        "interactive_ttft_p99_ms": percentile_ms(ttfts, 0.99),
        "interactive_ttft_p90_ms": percentile_ms(ttfts, 0.9),
        "interactive_ttft_p50_ms": percentile_ms(ttfts, 0.5),
        "interactive_requests": len(ttfts),
        "ttfts": ttfts,  # pooled over rounds by main(), not written
        "batch_req_s": round(len(finished) / seconds, 2) if batch else None,
        "errors": chat.errors + bulk_errors,
    }


async def batch_load(url: str, stop: float) -> None:
    """The batch key's closed loop until ``stop`` (monotonic, shared by the processes of
    the machine); its requests' (start, ttft, end) and errors printed as JSON."""
    bulk = Load(Endpoint(url), "sk-bench-nightly", LONG_WORDS, LONG_TOKENS)
    await asyncio.gather(*(bulk.client(1000 + i, stop, 0.0) for i in range(LOOP)))
    print(json.dumps({"done": bulk.done, "errors": bulk.errors}))


PRIORITY = 10
"""The interactive class's priority in the engines (the batch class's is 0)."""
ARMS = {
    "fair": (True, HEADROOM, True),
    "fair_no_priority": (True, HEADROOM, False),
    "fair_no_headroom": (True, 0.0, False),
    "fifo": (False, 0.0, False),
}
"""Each arm: fair queue on, the batch class's headroom, the engines' priority scheduling."""


async def one_arm(fair: bool, headroom: float, priority: bool, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys.yaml").write_text(KEYS % (PRIORITY if priority else 0, headroom))
        ordered = ["--scheduling-policy", "priority"] if priority else []
        discovery = f"embedded://{tmp}/disc"
        common = ["--namespace", NS, "--discovery", discovery]
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamoctl", "worker", "--model", MODEL, "--block-size", "16",
            "--num-workers", str(INSTANCES), "--num-gpu-blocks", str(BLOCKS),
            "--speedup-ratio", SPEEDUP, *ordered, *common,
            stderr=asyncio.subprocess.DEVNULL)]  # fmt: skip
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
        "ttfts": {"alone": alone["ttfts"], "shared": shared["ttfts"]},
        "phases": {"interactive_alone": alone, "batch_alone": batch, "shared": shared},
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its rounds: TTFT percentiles over every interactive request of every
    round pooled (steadier than a mean of per-round p99s, each often one stall of a loaded
    machine), batch throughput the mean of rounds."""
    if not runs:
        return {}
    out: dict[str, Any] = {}
    for label in ("alone", "shared"):
        pooled = tail([t for r in runs for t in r["ttfts"][label]])
        for name in ("p50", "p90", "p99"):
            out[f"interactive_ttft_{name}_{label}_ms"] = pooled[f"{name}_ms"]
        out[f"interactive_requests_{label}"] = pooled["requests"]
    for key in ("batch_req_s_alone", "batch_req_s_shared"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = round(sum(values) / len(values), 2) if values else None
    for name, suffix in (("ttft_ratio", "p99"), ("ttft_p90_ratio", "p90")):
        alone = out[f"interactive_ttft_{suffix}_alone_ms"]
        shared = out[f"interactive_ttft_{suffix}_shared_ms"]
        out[name] = round(shared / alone, 2) if alone and shared else None
    b_alone, b_shared = out["batch_req_s_alone"], out["batch_req_s_shared"]
    out["batch_share"] = round(b_shared / b_alone, 2) if b_alone and b_shared else None
    return out


def _share(runs: dict[str, list[dict[str, Any]]], arm: str, base: str) -> float | None:
    """The batch key's shared throughput in ``arm`` over its alone throughput in ``base``:
    what the headroom costs the batch key against a deployment without it."""
    shared = summary(runs.get(arm, [])).get("batch_req_s_shared")
    alone = summary(runs.get(base, [])).get("batch_req_s_alone")
    return round(shared / alone, 2) if shared and alone else None


def _pooled(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The interactive key alone is the same run in every arm, so its requests of all
    arms pooled are the steadier baseline: each arm's shared p99 and p90 over it."""
    base = tail([t for arm in runs.values() for r in arm for t in r["ttfts"]["alone"]])
    if not base["requests"]:
        return {}
    ratios = {}
    for arm, arm_runs in runs.items():
        shared = tail([t for r in arm_runs for t in r["ttfts"]["shared"]])
        if shared["p99_ms"] and base["p99_ms"] and shared["p90_ms"] and base["p90_ms"]:
            ratios[arm] = {"p99": round(shared["p99_ms"] / base["p99_ms"], 2),
                           "p90": round(shared["p90_ms"] / base["p90_ms"], 2)}  # fmt: skip
    return {"interactive_ttft_alone_pooled": base, "ttft_ratio_of_pooled_alone": ratios}


def _written(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the JSON keeps it: without its samples."""
    phases = {name: {k: v for k, v in phase.items() if k != "ttfts"}
              for name, phase in run["phases"].items()}  # fmt: skip
    return {**{k: v for k, v in run.items() if k not in ("ttfts", "phases")}, "phases": phases}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="benchmarks/results/fair_share.json")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS),
                        default=["fair", "fair_no_priority", "fifo"])  # fmt: skip
    parser.add_argument("--batch-load", help=argparse.SUPPRESS)
    parser.add_argument("--batch-stop", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch_load:  # the batch key's own process (phase)
        asyncio.run(batch_load(args.batch_load, args.batch_stop))
        return
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    loads = []
    for r in range(args.rounds):
        order = args.arms if r % 2 == 0 else args.arms[::-1]
        for arm in order:
            runs[arm].append(asyncio.run(one_arm(*ARMS[arm], args.seconds)))
            loads.append(round(os.getloadavg()[0], 2))
            print(arm, json.dumps({k: v for k, v in _written(runs[arm][-1]).items()
                                   if k != "phases"}), flush=True)  # fmt: skip
    others = {"fair_no_priority": "fair_without_priority",
              "fair_no_headroom": "fair_without_headroom"}  # fmt: skip
    result = {
        **summary(runs.get("fair", [])),
        "without_fair_share": summary(runs.get("fifo", [])),
        **{label: summary(runs[arm]) for arm, label in others.items() if arm in runs},
        **_pooled(runs),
        "batch_share_of_fifo": _share(runs, "fair", "fifo"),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "load_average_1min_after_each_arm": loads,
        "deployment": f"1 worker process x {INSTANCES} mocker instances ({BLOCKS} blocks of 16, "
        f"--speedup-ratio {SPEEDUP}); frontend --busy-kv-usage {BUSY}, --queue-timeout 300; "
        f"fair: the fair queue, the batch class's headroom {HEADROOM} and the interactive "
        f"class's priority {PRIORITY} with the mocker's --scheduling-policy priority; "
        "fair_without_priority: the same with the engines first come first served; "
        "without_fair_share: --fifo-admission, no headroom, no priority",
        "workload": f"interactive: {SESSIONS} sessions, ~{SHORT_WORDS + 4}-word prompts, "
        f"{SHORT_TOKENS} tokens, {THINK_S} s think; batch: closed loop of {LOOP}, "
        f"~{LONG_WORDS + 4}-word prompts, {LONG_TOKENS} tokens; classes 8:1; each phase "
        f"{args.seconds} s after 3 s warm-up; TTFT percentiles over every request of an "
        "arm's rounds pooled (interactive_requests_*: how many)",
        "rounds": args.rounds,
        "runs": {arm: [_written(r) for r in arm_runs] for arm, arm_runs in runs.items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result.get(k) for k in ("ttft_ratio", "ttft_p90_ratio", "batch_share",
                                                  "ttft_ratio_of_pooled_alone")}))  # fmt: skip


if __name__ == "__main__":
    main()
