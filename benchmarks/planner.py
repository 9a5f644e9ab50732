"""The SLA planner against static provisioning, on a bursty load, the deployments side by
side in one run.

    python benchmarks/planner.py [--workload bursty|trace] [--out FILE] [--plot PNG]

Four ``dynamoctl up`` deployments of mocker workers on the real clock (local target, one
private ``DYNAMOCTL_HOME``): ``static-small`` (1 replica), ``static-medium`` (2: about what
the planner spends, the reference's "static provisioning" at equal cost),
``static-large`` (4 replicas) and ``planner`` (1 replica and a ``planner:`` section, at
most 4, GPU budget 4). Each gets
the same open-loop load from ``dynamoctl.bench``: Poisson arrivals at a rate that is low,
jumps (the spike), holds high (the plateau), then falls back; or (``--workload trace``,
results in ``planner_trace.json``) a Mooncake-format trace whose rate rises over 30 s,
holds, and falls over 30 s, prompts sharing their first block in 8 groups. The planner runs both
loops: the throughput loop every 10 s from a profile computed from the mocker's timing
model (the replicas' floor), the load loop every 2 s above it. A mocker replica counts as
one GPU. Reported per deployment: the fraction of requests meeting both the TTFT and the
ITL target (a failed or unfinished request meets neither), TTFT p50/p99, failed requests,
GPU-seconds over the load window (replicas holding a GPU, sampled from ``status`` every
0.5 s, integrated from the start of the load to the end of its schedule; the tail while
open requests end and the planner drains is only in ``gpu_seconds_whole_run``), scale events,
and for the planner the seconds from the spike to its first scale-up and to that
replica's READY. The mockers run at ``speedup-ratio`` 0.1 (a simulated second lasts ten):
what a replica can carry fits the request rates one shared machine generates and serves.
Bounded: the load lasts ``sum(phases)`` seconds, open requests get 60 s, then ``down``.

``--recompute`` rewrites the cost figures of an existing result file (``--out``) from the
replica counts it stores, without running anything.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
from chaos import dynamoctl, free_port
from machine import machine
from probes import MODEL, latency_ms

from dynamoctl.bench.client import RequestRecord, Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.workload import (
    LengthDist,
    Session,
    TraceEntry,
    synthetic_sessions,
    trace_sessions,
)
from dynamoctl.engines.mocker.timing import TimingModel
from dynamoctl.planner.perf import PROFILE_VERSION, DecodePoint, PrefillPoint, Profile

TTFT_MS, ITL_MS = 1500.0, 500.0
SPEEDUP = 0.1
BLOCKS, BLOCK_SIZE, STEP_TOKENS = 4096, 16, 2048
PHASES = (("low", 25.0, 0.8), ("spike and plateau", 50.0, 7.0), ("fall", 35.0, 0.8))
"""(name, seconds, requests per second) of the bursty load, in order."""
TRACE_RATE = ((0.0, 0.8), (20.0, 0.8), (50.0, 7.0), (70.0, 7.0), (100.0, 0.8), (110.0, 0.8))
"""(seconds, requests per second) corners of the trace's rate, linear in between: a rise
over 30 s, a plateau, a fall over 30 s."""
MAX_REPLICAS = 4
CLIENT_TIMEOUT_S = 180.0
GONE = ("STOPPED", "FAILED", "PENDING")
DEPLOYMENTS = {"static-small": 1, "static-medium": 2, "static-large": MAX_REPLICAS, "planner": 1}
"""Name → replicas at start."""

PLANNER = f"""\
planner:
  mode: both
  ttft_target_ms: {TTFT_MS}
  itl_target_ms: {ITL_MS}
  agg_max_replicas: {MAX_REPLICAS}
  gpu_budget: {MAX_REPLICAS}
  throughput_interval: 10.0
  predictor: constant
  load_interval: 2.0
  cooldown: 5.0
  stable_intervals: 2
  profile: PROFILE
"""


def mocker_profile() -> Profile:
    """The performance profile of the benchmark's mocker replicas, computed from the
    mocker's own timing model (what a profiling sweep of it would measure, without its
    noise): prefill time by prompt length, in steps of at most ``STEP_TOKENS``; decode
    step time by batch and context, from the KV usage they make."""
    timing, scale = TimingModel(), 1000.0 * SPEEDUP
    capacity = BLOCKS * BLOCK_SIZE

    def prefill(isl: int) -> float:
        full, rest = divmod(isl, STEP_TOKENS)
        return (full * timing.prefill_ms(STEP_TOKENS) + timing.prefill_ms(rest)) / scale

    decode = [
        DecodePoint(batch=b, context=c, itl=timing.decode_ms(min(1.0, b * c / capacity)) / scale)
        for c in (512, 1024, 2048, 4096)
        for b in (1, 2, 4, 8, 16, 32, 64, 128)
    ]
    return Profile(
        version=PROFILE_VERSION,
        model=MODEL,
        engine="mocker",
        gpus_per_replica=0,
        prefill=tuple(
            PrefillPoint(isl=n, seconds=prefill(n)) for n in (128, 512, 1024, 2048, 4096)
        ),
        decode=tuple(decode),
        kv_capacity_tokens=capacity,
        source=f"the mocker's timing model at speedup-ratio {SPEEDUP} (benchmarks/planner.py)",
    )


def recipe(name: str, port: int, replicas: int, profile: Path) -> str:
    """A mocker deployment whose requests never fail from overload (they queue), so that
    a failure can only come from scaling."""
    return f"""\
schema: 1
name: {name}
model: {{name: {MODEL}, path: {MODEL}, block_size: 16}}
frontend: {{port: {port}, queue_timeout: 120.0, max_queued: 4096,
            router: {{mode: kv, busy_kv_usage: null}}}}
workers:
  agg:
    engine: mocker
    replicas: {replicas}
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: {BLOCKS}, max-num-batched-tokens: {STEP_TOKENS},
                   speedup-ratio: {SPEEDUP}}}
supervision: {{probe_interval: 0.5, drain_timeout: 60}}
{PLANNER.replace("PROFILE", str(profile)) if name == "planner" else ""}"""


def bursty(seed: int) -> Iterator[Session]:
    """Single-turn sessions (500 to 1500 prompt tokens, 16 out, no shared prefix) arriving
    as a Poisson process whose rate follows :data:`PHASES`."""
    rng = random.Random(f"{seed}/bursty")
    sessions = synthetic_sessions(LengthDist.parse("uniform:500:1500"), LengthDist.parse("16"))
    t, start = 0.0, 0.0
    for _, seconds, rate in PHASES:
        end = start + seconds
        while (t := t + rng.expovariate(rate)) < end:
            yield msgspec.structs.replace(next(sessions), arrival=t)
        t, start = end, end


def trace_rate(t: float) -> float:
    """The trace's request rate at ``t`` (:data:`TRACE_RATE`, linear between corners)."""
    for (t0, r0), (t1, r1) in itertools.pairwise(TRACE_RATE):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
    return TRACE_RATE[-1][1]


def mooncake_trace(seed: int) -> list[TraceEntry]:
    """A trace in Mooncake's format (arrival in ms, lengths, 512-token block hash ids) whose
    arrivals are a Poisson process at :func:`trace_rate` (by thinning): 500 to 1500 prompt
    tokens whose first block is one of 8 shared ones (a system prompt), 16 out. Made here
    because no public trace can be downloaded where this runs; ``dynamoctl bench --trace``
    replays a real one the same way."""
    rng = random.Random(f"{seed}/trace")
    peak, end = max(rate for _, rate in TRACE_RATE), TRACE_RATE[-1][0]
    unique = itertools.count(1000)
    entries, t = [], 0.0
    while (t := t + rng.expovariate(peak)) < end:
        if rng.random() * peak > trace_rate(t):
            continue
        length = rng.randint(500, 1500)
        blocks = [rng.randrange(8)] + [next(unique) for _ in range(-(-length // 512) - 1)]
        entries.append(TraceEntry(timestamp=t * 1000, input_length=length, output_length=16,
                                  hash_ids=blocks))  # fmt: skip
    return entries


@dataclass(frozen=True)
class Workload:
    """One of the loads the deployments get."""

    sessions: Callable[[], Iterator[Session]]
    seconds: float
    rise: float
    """When the rate starts to rise (time to react is measured from here)."""
    edges: tuple[float, ...]
    """Where the rate changes (vertical lines on the plot)."""
    title: str


WORKLOADS = {
    "bursty": Workload(
        sessions=lambda: bursty(seed=7),
        seconds=sum(p[1] for p in PHASES),
        rise=PHASES[0][1],
        edges=(PHASES[0][1], PHASES[0][1] + PHASES[1][1]),
        title=" → ".join(f"{rate:g} req/s for {seconds:g} s" for _, seconds, rate in PHASES),
    ),
    "trace": Workload(
        sessions=lambda: trace_sessions(mooncake_trace(seed=7)),
        seconds=TRACE_RATE[-1][0],
        rise=TRACE_RATE[1][0],
        edges=tuple(t for t, _ in TRACE_RATE[1:-1]),
        title="Mooncake-format trace, "
        + " → ".join(f"{rate:g} req/s at {t:g} s" for t, rate in TRACE_RATE[1:-1]),
    ),
}


class Replicas:
    """Samples a deployment's ``status`` every 0.5 s: replicas holding a GPU, READY ones,
    and the planner's desired count."""

    def __init__(self, control: str, token: str, clock: LoopClock, origin: float) -> None:
        headers = {"authorization": f"Bearer {token}"}
        self.http = httpx.AsyncClient(base_url=control, headers=headers, trust_env=False)
        self.clock, self.origin = clock, origin
        self.samples: list[tuple[float, int, int]] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            rows = (await self.http.get("/status")).json()["instances"]
            agg = [r for r in rows if r["pool"] == "agg"]
            holding = sum(r["state"] not in GONE for r in agg)
            ready = sum(r["state"] == "READY" for r in agg)
            self.samples.append((self.clock.now() - self.origin, holding, ready))
            await asyncio.sleep(0.5)
        await self.http.aclose()

    def scale_events(self) -> int:
        return sum(a[1] != b[1] for a, b in zip(self.samples, self.samples[1:], strict=False))

    def first_after(self, t: float, column: int) -> float | None:
        """Seconds from ``t`` until the count in ``column`` first exceeded its value at ``t``."""
        before = next((s[column] for s in reversed(self.samples) if s[0] <= t), None)
        later = (
            s[0] for s in self.samples if s[0] > t and before is not None and s[column] > before
        )
        first = next(later, None)
        return None if first is None else round(first - t, 1)


def gpu_seconds(samples: list[tuple[float, int, int]], start: float, end: float) -> float:
    """Replicas holding a GPU (column 1 of the samples, a step function) integrated over
    ``[start, end]`` seconds since the load started."""
    pairs = itertools.pairwise(samples)
    return sum(max(0.0, min(b[0], end) - max(a[0], start)) * a[1] for a, b in pairs)


def costs(found: dict[str, Any], window: float) -> dict[str, Any]:
    """Each deployment's GPU-seconds over the load window ``[0, window]`` and over the whole
    run (into ``found``), and the planner's against each static deployment."""
    for row in found.values():
        samples = row["replicas_over_time"]
        row["gpu_seconds"] = round(gpu_seconds(samples, 0.0, window), 1)
        row["gpu_seconds_whole_run"] = round(gpu_seconds(samples, 0.0, math.inf), 1)
        row["replicas_min_max"] = [min(s[1] for s in samples), max(s[1] for s in samples)]
    planner = found["planner"]
    return {
        name: {
            "gpu_seconds_pct": round(100 * (planner["gpu_seconds"] / row["gpu_seconds"] - 1), 1),
            "gpu_seconds_whole_run_pct": round(
                100 * (planner["gpu_seconds_whole_run"] / row["gpu_seconds_whole_run"] - 1), 1
            ),
            "breaches": [planner["sla_breaches"], row["sla_breaches"]],
        }
        for name, row in found.items()
        if name != "planner"
    }


def sla_met(record: RequestRecord) -> bool:
    if record.error is not None or record.ttft is None or record.ttft * 1000 > TTFT_MS:
        return False
    return record.tpot is None or record.tpot * 1000 <= ITL_MS


async def load_all(
    workload: Workload, urls: dict[str, str], access: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    clock = LoopClock()
    origin = clock.now()
    stop = asyncio.Event()
    watches = {name: Replicas(*access[name], clock, origin) for name in urls}
    watching = [asyncio.create_task(w.run(stop)) for w in watches.values()]
    endpoints = {name: Endpoint(url) for name, url in urls.items()}
    seconds = workload.seconds

    async def one(name: str) -> Any:
        sender = Sender(endpoints[name], MODEL, clock, timeout=CLIENT_TIMEOUT_S)
        return await drive(workload.sessions(), sender.send, clock=clock,
                           limits=Limits(10**9, seconds, 60, max_inflight=4096))  # fmt: skip

    outcomes = dict(zip(urls, await asyncio.gather(*(one(n) for n in urls)), strict=True))
    await asyncio.sleep(2.0)  # the planner's drains after the fall
    stop.set()
    await asyncio.gather(*watching)
    for endpoint in endpoints.values():
        await endpoint.close()
    spike = workload.rise
    found: dict[str, Any] = {}
    for name, outcome in outcomes.items():
        records, watch = outcome.records, watches[name]
        sent = len(records) + outcome.unfinished
        met = sum(sla_met(r) for r in records)
        ok = [r for r in records if r.error is None]
        found[name] = {
            "requests": sent,
            "failed": sent - len(ok),
            "sla_met_fraction": round(met / sent, 3) if sent else None,
            "sla_breaches": sent - met,
            "ttft_ms": latency_ms([r.ttft for r in ok if r.ttft is not None]),
            "itl_ms": latency_ms([r.tpot for r in ok if r.tpot is not None]),
            "scale_events": watch.scale_events(),
            "react_s": {
                "first_scale_up": watch.first_after(spike, 1),
                "first_new_replica_ready": watch.first_after(spike, 2),
            },
            "replicas_over_time": watch.samples,
            "ttft_over_time": [
                (round(r.start, 2), round(r.ttft, 3)) for r in ok if r.ttft is not None
            ],
        }
    return found


def plot(workload: Workload, found: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for name, row in found.items():
        times = [s[0] for s in row["replicas_over_time"]]
        top.step(times, [s[1] for s in row["replicas_over_time"]], where="post", label=name)
        points = row["ttft_over_time"]
        bottom.scatter([p[0] for p in points], [p[1] for p in points], s=4, label=name)
    bottom.axhline(TTFT_MS / 1000, color="grey", linestyle="--", label="TTFT target")
    for edge in workload.edges:
        for ax in (top, bottom):
            ax.axvline(edge, color="lightgrey", linewidth=1)
    top.set_ylabel("replicas holding a GPU")
    bottom.set_ylabel("TTFT (s), by request start")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds since the load started")
    top.legend(loc="upper right")
    bottom.legend(loc="upper right", markerscale=3)
    title = f"SLA planner vs static provisioning (mocker, speedup 0.1): {workload.title}"
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def deploy_and_load(workload: Workload) -> dict[str, Any]:
    """Bring the deployments up in one private home, load them all at once, bring them
    down; what each got, with the planner's logged decisions."""
    with tempfile.TemporaryDirectory(prefix="dynamoctl-planner-") as tmp:
        home = Path(tmp) / "home"
        urls, access = {}, {}
        profile = Path(tmp) / "mocker-profile.json"
        profile.write_bytes(msgspec.json.encode(mocker_profile()))
        try:
            for name, replicas in DEPLOYMENTS.items():
                port = free_port()
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(recipe(name, port, replicas, profile))
                up = dynamoctl(home, "up", str(path), "--detach")
                if up.returncode != 0:
                    sys.exit(f"up {name} failed:\n{up.stderr}")
                state = json.loads((home / "runs" / name / "state.json").read_text())
                urls[name] = f"http://127.0.0.1:{port}"
                access[name] = (state["control"], state["token"])
                print(f"{name} up", flush=True)
            began = time.monotonic()
            found = asyncio.run(load_all(workload, urls, access))
            print(f"load done in {time.monotonic() - began:.0f} s", flush=True)
            log = (home / "runs" / "planner" / "logs" / "planner-0.log").read_text()
            found["planner"]["decisions_logged"] = [
                line.split(": ", 1)[1][:160] for line in log.splitlines() if " loop: " in line
            ]
        finally:
            for name in DEPLOYMENTS:
                dynamoctl(home, "down", name)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bursty")
    parser.add_argument("--out", help="default: benchmarks/results/planner[_WORKLOAD].json")
    parser.add_argument("--plot", help="default: docs/img/planner[_WORKLOAD].png")
    parser.add_argument(
        "--recompute", action="store_true", help="rewrite --out's costs from its replica counts"
    )
    args = parser.parse_args()
    suffix = "" if args.workload == "bursty" else f"_{args.workload}"
    args.out = args.out or f"benchmarks/results/planner{suffix}.json"
    args.plot = args.plot or f"docs/img/planner{suffix}.png"
    workload = WORKLOADS[args.workload]
    if args.recompute:
        result = json.loads(Path(args.out).read_text())
        found = {name: result[name] for name in DEPLOYMENTS}
    else:
        found = deploy_and_load(workload)
        result = {
            "machine": machine(),
            "targets": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS},
            "workload": args.workload,
            "load": workload.title,
        }
    result["deployments"] = {
        "static-small": "1 mocker replica",
        "static-medium": "2 mocker replicas",
        "static-large": f"{MAX_REPLICAS} mocker replicas",
        "planner": f"1 replica at start, planner mode both (throughput loop every 10 s, "
        f"constant predictor, profile from the mocker's timing model; load loop every 2 s, "
        f"cooldown 5 s), at most {MAX_REPLICAS}, gpu_budget {MAX_REPLICAS}",
    }
    result["load_window_s"] = [0.0, workload.seconds]
    result["client_timeout_s"] = CLIENT_TIMEOUT_S
    result["planner_vs"] = costs(found, workload.seconds)
    result.update(found)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if not args.recompute:
        plot(workload, found, Path(args.plot))
    brief = {
        name: {k: v for k, v in row.items() if not k.endswith("over_time")}
        for name, row in found.items()
    }
    print(json.dumps({"planner_vs": result["planner_vs"], **brief}, indent=1))
    print(f"wrote {args.out}" + ("" if args.recompute else f" and {args.plot}"))


if __name__ == "__main__":
    main()
