"""Mocker benchmark: how fast the simulation runs, and how many engines one process keeps
in step with the real clock.

    python benchmarks/mocker.py [--out results.json] [--speedups 1000,100] [--window 2.5]

1. Virtual time, one engine with Dynamo's default arguments: a burst of requests (ISL 1024
   with a shared half, OSL 128) read by one task each, as a worker would. Reports scheduler
   steps and tokens per wall second: the pure simulation speed. Also a lone request (batch
   of 1) for the per-step overhead, and the cost of an idle engine.
2. Real time at each speedup: N engines in one process, each fed a Poisson stream of
   requests (default one per 10 simulated seconds, ISL 512, OSL 64). The process keeps up
   while requests are submitted and steps end on time; overloaded, the lag (clock time
   past a deadline) grows without bound. Verdict per N: ``ok`` if the 99th percentile lag
   stays under ``--max-lag-ms`` of real time (the event loop's timer granularity is 1 ms).
   The sweep doubles N until two results in a row fall behind.

Prints tables and writes machine-readable JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, RealClock, VirtualClock

VOCAB = 32000


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def prompts(rng: random.Random, count: int, isl: int, groups: int) -> list[list[int]]:
    """``count`` prompts of ``isl`` tokens; the first half is shared within ``groups``."""
    shared = [[rng.randrange(VOCAB) for _ in range(isl // 2)] for _ in range(groups)]
    return [
        shared[i % groups] + [rng.randrange(VOCAB) for _ in range(isl - isl // 2)]
        for i in range(count)
    ]


async def drain(engine: MockerEngine, request: GenerateRequest) -> int:
    n = 0
    async for chunk in engine.generate(request):
        n += len(chunk.token_ids)
    return n


# --------------------------------------------------------------------------- virtual time


async def burst(requests: int, isl: int, osl: int, concurrency: int) -> dict[str, float]:
    engine = MockerEngine(MockerConfig(), clock=VirtualClock())
    engine.set_kv_event_sink(lambda batch: None)  # events are built, as for a publisher
    await engine.start()
    work = prompts(random.Random(0), requests, isl, groups=20)
    gate = asyncio.Semaphore(concurrency)

    async def client(i: int) -> None:
        async with gate:
            request = GenerateRequest(f"r{i}", work[i], osl, ignore_eos=True)
            assert await drain(engine, request) == osl

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(requests)))
    wall = time.perf_counter() - t0
    await engine.stop()
    s = engine.stats
    return {
        "requests": requests,
        "isl": isl,
        "osl": osl,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "steps": s.steps,
        "steps_per_s": round(s.steps / wall),
        "output_tokens_per_s": round(s.output_tokens / wall),
        "prefill_tokens_per_s": round(s.prefill_tokens / wall),
        "simulated_s": round(s.busy_s, 2),
        "simulated_over_wall": round(s.busy_s / wall, 1),
        "preemptions": engine.num_preemptions,
    }


async def lone_request(osl: int) -> dict[str, float]:
    engine = MockerEngine(MockerConfig(), clock=VirtualClock())
    await engine.start()
    t0 = time.perf_counter()
    await drain(engine, GenerateRequest("lone", list(range(64)), osl, ignore_eos=True))
    wall = time.perf_counter() - t0
    await engine.stop()
    return {"steps": engine.stats.steps, "steps_per_s": round(engine.stats.steps / wall)}


async def idle_cost(count: int) -> dict[str, float]:
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    engines = [MockerEngine(MockerConfig(), clock=VirtualClock()) for _ in range(count)]
    for engine in engines:
        await engine.start()
    await asyncio.sleep(0)
    wall = time.perf_counter() - t0
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    for engine in engines:
        await engine.stop()
    return {
        "engines": count,
        "kib_per_engine": round(used / count / 1024, 1),
        "start_ms_per_engine": round(wall / count * 1e3, 3),
    }


# --------------------------------------------------------------------------- real time


async def real_time(
    n: int, speedup: float, rate: float, isl: int, osl: int, window: float
) -> dict[str, Any]:
    """``n`` engines at ``speedup``, each with Poisson arrivals at ``rate`` per simulated
    second, for ``window`` real seconds after a short warm-up."""
    rng = random.Random(n)
    engines = [
        MockerEngine(MockerConfig(speedup_ratio=speedup), clock=RealClock(speedup))
        for _ in range(n)
    ]
    for engine in engines:
        engine.set_kv_event_sink(lambda batch: None)
        await engine.start()
    pool = prompts(rng, 64, isl, groups=8)
    warmup = 0.3
    start = time.monotonic()
    measure_from, stop_at = start + warmup, start + warmup + window
    lags: list[float] = []  # simulated seconds past a deadline
    done_tokens = 0
    readers: set[asyncio.Task[None]] = set()

    async def read(engine: MockerEngine, request: GenerateRequest) -> None:
        nonlocal done_tokens
        got = await drain(engine, request)
        if time.monotonic() < stop_at:
            done_tokens += got

    async def arrivals(idx: int, engine: MockerEngine) -> None:
        local = random.Random(idx)
        clock = engine.clock
        due = clock.now() + local.expovariate(rate) * local.random()  # desynchronise
        k = 0
        while time.monotonic() < stop_at:
            await clock.sleep_until(due)
            if time.monotonic() >= measure_from:
                lags.append(clock.now() - due)
            prompt = pool[local.randrange(len(pool))]
            request = GenerateRequest(f"e{idx}-{k}", prompt, osl, ignore_eos=True)
            task = asyncio.create_task(read(engine, request))
            readers.add(task)
            task.add_done_callback(readers.discard)
            k += 1
            due += local.expovariate(rate)

    async def sample_step_lag() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(0.01)
            if time.monotonic() >= measure_from:
                lags.extend(e.stats.lag_s for e in engines if e.scheduler.has_work())

    await asyncio.gather(sample_step_lag(), *(arrivals(i, e) for i, e in enumerate(engines)))
    for engine in engines:
        await engine.stop()
    for task in list(readers):
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    lag_ms = [x / speedup * 1e3 for x in lags]  # real milliseconds
    return {
        "engines": n,
        "offered_output_tokens_per_s": round(n * rate * osl * speedup),
        "output_tokens_per_s": round(done_tokens / window),
        "lag_p50_ms": round(pct(lag_ms, 0.5), 2),
        "lag_p99_ms": round(pct(lag_ms, 0.99), 2),
        "lag_max_s_simulated": round(max(lags, default=0.0), 2),
    }


async def sweep(
    speedup: float, rate: float, isl: int, osl: int, window: float, max_lag_ms: float
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    n, behind = 1, 0
    while behind < 2 and n <= 1024:
        row = await real_time(n, speedup, rate, isl, osl, window)
        row["keeps_up"] = row["lag_p99_ms"] < max_lag_ms
        behind = 0 if row["keeps_up"] else behind + 1
        rows.append(row)
        print(
            f"  {speedup:6g}x {n:5d} engines | offered {row['offered_output_tokens_per_s']:9d} "
            f"tok/s, done {row['output_tokens_per_s']:8d} tok/s | lag p50 "
            f"{row['lag_p50_ms']:8.2f} ms p99 {row['lag_p99_ms']:8.2f} ms | "
            f"{'ok' if row['keeps_up'] else 'BEHIND'}"
        )
        n *= 2
    return rows


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loop": type(asyncio.get_running_loop()).__module__,
        },
    }
    b = await burst(args.requests, 1024, 128, 256)
    results["virtual_burst"] = b
    print(
        f"virtual time, burst of {b['requests']} (ISL 1024, OSL 128, 256 concurrent): "
        f"{b['wall_s']} s wall, {b['steps_per_s']} steps/s, {b['output_tokens_per_s']} output "
        f"tok/s, {b['prefill_tokens_per_s']} prefill tok/s, {b['simulated_over_wall']}x real time"
    )
    lone = await lone_request(4000)
    results["virtual_lone_request"] = lone
    print(f"virtual time, lone request: {lone['steps_per_s']} steps/s (batch of 1)")
    idle = await idle_cost(500)
    results["idle_engines"] = idle
    print(
        f"idle engines: {idle['kib_per_engine']} KiB and {idle['start_ms_per_engine']} ms "
        "to build and start each"
    )
    results["real_time"] = {
        "rate_per_engine_per_simulated_s": args.rate,
        "isl": 512,
        "osl": 64,
        "window_s": args.window,
        "max_lag_ms": args.max_lag_ms,
        "sweeps": {},
    }
    print(
        f"real time: each engine gets {args.rate} req per simulated s (ISL 512, OSL 64); "
        f"ok = lag p99 < {args.max_lag_ms} ms real"
    )
    for speedup in args.speedups:
        rows = await sweep(speedup, args.rate, 512, 64, args.window, args.max_lag_ms)
        ok = [r["engines"] for r in rows if r["keeps_up"]]
        results["real_time"]["sweeps"][str(speedup)] = {
            "rows": rows,
            "max_engines_keeping_up": max(ok, default=0),
        }
        print(f"  -> at {speedup:g}x one process keeps up with {max(ok, default=0)} engines")
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/mocker.json")
    parser.add_argument(
        "--speedups", type=lambda s: [float(x) for x in s.split(",")], default=[1000.0, 100.0]
    )
    parser.add_argument("--rate", type=float, default=0.1, help="req per simulated s per engine")
    parser.add_argument("--window", type=float, default=2.5, help="real seconds per point")
    parser.add_argument("--max-lag-ms", type=float, default=10.0)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        results = uvloop.run(measure(args))
    else:
        results = asyncio.run(measure(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
