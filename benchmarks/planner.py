"""The SLA planner against every static size, on a fleet of mockers that start like real
replicas, three workloads.

    python benchmarks/planner.py [--workload step|diurnal|spiky ...] [--out FILE]

The fleet: mocker engines (``MockerEngine``, the shipped simulated engine) of
Llama-3.1-8B on an H100 at TP 1 (step times from AI Configurator, ``perf-model: aic``)
whose weights come from a shared filesystem: each replica starts in 46 s (16.06 GB at
1 GB/s, then 30 s of engine initialisation; docs/mocker.md, "Start-up") and counts as one
GPU from the moment it is asked for until it has drained. A router sends each request to
the ready replica with the fewest requests (then the least queued prefill). Static arms
hold N replicas, started before the load; the planner arm starts with what its profile
says the first minute's rate needs (as a deployment it ran before the window would hold)
and runs the planner's own decisions (``decide_load`` every ``load_interval``, ``decide_throughput``
every ``throughput_interval`` from a profile of the same timing, its pool metrics built by
the service's ``pool_metrics``) and applies them as the supervisor does: a new replica
starts (46 s), a removed one stops taking requests and drains.

Time is simulated: every engine, the router, the arrivals and the planner share one
discrete-event clock (:class:`FleetClock`) that jumps to the next deadline once nothing
can run at the current instant, so a 10-minute workload runs in as long as the CPU takes
to simulate it, every arm sees the same arrivals at the same instants, and the results do
not depend on how loaded the machine is (its load average is recorded anyway).

Per arm: requests, SLA breaches (TTFT over target, or mean ITL over target, or failed or
unfinished), failed requests, and GPU-seconds over the load window (replicas holding a
GPU, integrated from the first arrival to the end of the schedule).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machine import machine
from planner_fleet import (
    COLD_S,
    ENGINE_ARGS,
    ISL,
    ITL_S,
    MODEL,
    OSL,
    START_MODES,
    SYSTEM,
    TTFT_S,
    Arrival,
    Fleet,
    FleetClock,
    Record,
    StartMode,
)

from dynamoctl.engines.mocker import MockerConfig
from dynamoctl.engines.mocker.aic_timing import AicTiming
from dynamoctl.engines.mocker.startup import Startup
from dynamoctl.planner.decide import decide_load, decide_throughput
from dynamoctl.planner.observe import Window, WorkerLoad
from dynamoctl.planner.perf import (
    PROFILE_VERSION,
    DecodePoint,
    PerfModel,
    PrefillPoint,
    Profile,
    agg_need,
)
from dynamoctl.planner.predict import TrafficForecaster
from dynamoctl.planner.records import Forecast, PlannerState, PoolSpec, TrafficSample
from dynamoctl.planner.service import pool_metrics
from dynamoctl.planner.settings import PlannerSettings

MAX_REPLICAS = 5
SETTINGS = PlannerSettings(
    mode="both", ttft_target_ms=TTFT_S * 1e3, itl_target_ms=ITL_S * 1e3,
    agg_max_replicas=MAX_REPLICAS, gpu_budget=MAX_REPLICAS, load_interval=5.0,
    throughput_interval=15.0, predictor="constant", cooldown=30.0, stable_intervals=2,
    prefill_queue_up=0.5, forecast_startups=1.5,
)  # fmt: skip
"""The planner arm's settings (the recipe's ``planner:`` section). The last three were
chosen on the diurnal workload (docs/planner.md, "Measured": 30 s / 1.0 / 1.0 breached
592 times, 15 s / 0.5 / 1.0 81 times, these 8)."""


# -- workloads -------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    rate: Callable[[float], float]
    """Requests per second at simulated second t."""
    seconds: float
    title: str


def _spiky_rate(seed: int, seconds: float) -> Callable[[float], float]:
    """A base rate with bursts (2.5-3.3x, 15-60 s each) at random times, as in the Azure LLM
    inference trace's shape, and short lulls."""
    rng = random.Random(f"{seed}/spikes")
    spikes = [
        (rng.uniform(40, seconds - 60), rng.uniform(15, 60), rng.uniform(2.5, 3.3))
        for _ in range(6)
    ]

    def rate(t: float) -> float:
        boost = max((k for start, length, k in spikes if start <= t < start + length), default=1)
        return 4.0 * boost

    return rate


WORKLOADS = {
    "step": Workload(
        rate=lambda t: 2.0 if t < 120 else 11.0,
        seconds=420.0,
        title="2 req/s for 120 s, then 11 req/s for 300 s",
    ),
    "diurnal": Workload(
        rate=lambda t: 1.0 + 11.0 * (1 - math.cos(2 * math.pi * t / 600.0)) / 2,
        seconds=600.0,
        title="a day compressed to 600 s: 1 → 12 → 1 req/s (raised cosine)",
    ),
    "spiky": Workload(
        rate=_spiky_rate(7, 420.0),
        seconds=420.0,
        title="4 req/s with six 2.5-3.3x bursts of 15-60 s at random times (seed 7)",
    ),
}


def arrivals(workload: Workload, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``workload.rate`` (by thinning), uniform lengths."""
    rng = random.Random(f"{seed}/arrivals")
    peak = max(workload.rate(t) for t in range(int(workload.seconds) + 1))
    found, t = [], 0.0
    while (t := t + rng.expovariate(peak)) < workload.seconds:
        if rng.random() * peak <= workload.rate(t):
            found.append(Arrival(t, rng.randint(*ISL), rng.randint(*OSL)))
    return found


# -- the planner, as the service runs it ----------------------------------------------------


def profile(timing: AicTiming) -> Profile:
    """What ``dynamoctl profile`` would measure of one replica: prefill time by prompt
    length (in steps of at most ``max_num_batched_tokens``), decode step time by batch and
    context, from the same timing tables."""
    step = ENGINE_ARGS["max_num_batched_tokens"]

    def prefill(isl: int) -> float:
        full, rest = divmod(isl, step)
        return (full * timing.prefill_ms(step) + timing.prefill_ms(rest)) / 1e3

    capacity = ENGINE_ARGS["num_gpu_blocks"] * ENGINE_ARGS["block_size"]
    return Profile(
        version=PROFILE_VERSION, model=MODEL, engine="mocker", gpus_per_replica=1,
        prefill=tuple(PrefillPoint(isl=n, seconds=prefill(n)) for n in (256, 1024, 2048, 4096)),
        decode=tuple(
            DecodePoint(batch=b, context=c, itl=timing.decode_ms(b, c) / 1e3)
            for c in (1024, 2048, 4096) for b in (1, 2, 4, 8, 16, 32, 64, 128)
        ),
        kv_capacity_tokens=capacity,
        source=f"AI Configurator step times of {MODEL} on {SYSTEM} (benchmarks/planner.py)",
    )  # fmt: skip


def window_of(fleet: Fleet, start: float, end: float) -> Window:
    """What a frontend's counters would show between two scrapes at ``start``, ``end``."""
    arrived = [r for r in fleet.records if start <= r.arrived < end]
    firsts = [r.first - r.arrived for r in fleet.records if r.first and start <= r.first < end]
    ended = [r for r in fleet.records if r.last and r.tokens > 1 and start <= r.last < end]
    itls = [(r.last - r.first) / (r.tokens - 1) for r in ended if r.last and r.first]
    return Window(
        seconds=end - start,
        requests=float(len(arrived)),
        mean_isl=sum(r.isl for r in arrived) / len(arrived) if arrived else 0.0,
        mean_osl=sum(r.tokens for r in ended) / len(ended) if ended else 0.0,
        ttft=sum(firsts) / len(firsts) if firsts else None,
        itl=sum(itls) / len(itls) if itls else None,
    )


def warm_size(model: PerfModel, load: list[Arrival]) -> int:
    """Replicas the planner arm starts with: what its profile says the first minute's rate
    needs, as a deployment the planner ran before the window would hold."""
    first = [a for a in load if a.at < 60.0]
    forecast = Forecast(
        rate=len(first) / 60.0,
        isl=sum(a.isl for a in first) / len(first),
        osl=sum(a.osl for a in first) / len(first),
    )
    return max(1, agg_need(model, forecast, TTFT_S, ITL_S).replicas)


async def plan(fleet: Fleet, model: PerfModel, replicas: int, end: float, log: list[str]) -> None:
    """The planner's two loops on the fleet's clock (``PlannerService.tick``'s order)."""
    settings, clock = SETTINGS, fleet.clock
    specs = [PoolSpec(role="agg", gpus_per_replica=1, min_replicas=1, max_replicas=MAX_REPLICAS)]
    state = PlannerState.start({"agg": replicas})
    forecaster = TrafficForecaster(settings.predictor, settings.predictor_window)
    marks = {"load": clock.now(), "throughput": clock.now()}
    while clock.now() < end:
        await clock.sleep(settings.load_interval)
        now = clock.now()
        span = window_of(fleet, marks["load"], now)
        marks["load"] = now
        serving = fleet.serving()
        workers = [
            WorkerLoad("agg", f"agg-{i}", r.engine.load_metrics(), now)
            for i, r in enumerate(serving)
        ]
        metrics = pool_metrics(["agg"], {"agg": len(serving)}, workers, span)
        if now - marks["throughput"] >= settings.throughput_interval:
            wide = window_of(fleet, marks["throughput"], now)
            marks["throughput"] = now
            sample = TrafficSample(
                at=now, interval=wide.seconds, requests=round(wide.requests),
                mean_isl=wide.mean_isl, mean_osl=wide.mean_osl, ttft=wide.ttft, itl=wide.itl,
                decode_batch=sum(w.metrics.num_running for w in workers) / max(len(workers), 1),
            )  # fmt: skip
            forecaster.observe(sample)
            decision, state = decide_throughput(
                settings=settings, specs=specs, state=state, model=model,
                forecast=forecaster.forecast(), observed=sample, now=now,
            )  # fmt: skip
            apply(fleet, decision.pools[0].desired, log, f"{now:.0f} throughput: {decision.reason}")
        decision, state = decide_load(
            settings=settings, specs=specs, state=state, model=model, load=metrics, now=now
        )
        apply(fleet, decision.pools[0].desired, log, f"{now:.0f} load: {decision.reason}")


def apply(fleet: Fleet, desired: int, log: list[str], line: str) -> None:
    holding = sum(not (r.draining or r.spare) and r.gone_at is None for r in fleet.replicas)
    if desired == holding:
        return
    log.append(f"{line} -> {desired}")
    for _ in range(desired - holding):
        fleet.add()
    for _ in range(holding - desired):
        fleet.remove()


# -- one arm -------------------------------------------------------------------------------


async def run_arm(
    name: str, load: list[Arrival], seconds: float, timing: AicTiming, mode: StartMode
) -> dict[str, Any]:
    clock = FleetClock()
    fleet = Fleet(clock, timing, mode)
    model = PerfModel(profile(timing))
    replicas = warm_size(model, load) if name == "planner" else int(name.split("-")[1])
    for _ in range(replicas):
        fleet.add()
    for _ in range(mode.spares if name == "planner" else 0):
        fleet.add(spare=True)
    await clock.run_until(COLD_S)  # every arm is ready when the load starts
    origin = clock.now()
    log: list[str] = []
    planner = None
    if name == "planner":
        planner = asyncio.create_task(plan(fleet, model, replicas, origin + seconds, log))

    async def arrive() -> None:
        sends = []
        for i, arrival in enumerate(load):
            await clock.sleep_until(origin + arrival.at)
            sends.append(asyncio.create_task(fleet.send(i, arrival)))
        await asyncio.gather(*sends)

    arriving = asyncio.create_task(arrive())
    await clock.run_until(origin + seconds + 120.0)  # the schedule, then 2 min to finish
    for task in (arriving, planner):
        if task is not None:
            task.cancel()
    for replica in fleet.replicas:
        await replica.engine.stop()
    counts = [(round(t - origin, 2), n, ready) for t, n, ready in fleet.counts]
    return {
        "name": name,
        "gpu_s": round(gpu_seconds(counts, 0.0, seconds), 1),
        "requests": len(fleet.records),
        "breaches": sum(r.breached() for r in fleet.records),
        "failed": sum(r.failed or r.last is None for r in fleet.records),
        "replicas_over_time": counts,
        "breaches_over_time": breach_series(fleet.records, origin, seconds),
        "decisions": log,
    }


def gpu_seconds(counts: list[tuple[float, int, int]], start: float, end: float) -> float:
    """Replicas holding a GPU (a step function changing at each count) over [start, end]."""
    total = 0.0
    for (t0, n, _), (t1, _, _) in itertools.pairwise([*counts, (math.inf, 0, 0)]):
        total += max(0.0, min(t1, end) - max(t0, start)) * n
    return total


def breach_series(records: list[Record], origin: float, seconds: float) -> list[list[float]]:
    """(second, requests arrived, breaches among them) per 10 s bin, for the plot."""
    bins = [[10.0 * i, 0.0, 0.0] for i in range(math.ceil(seconds / 10))]
    for r in records:
        b = bins[min(int((r.arrived - origin) // 10), len(bins) - 1)]
        b[1] += 1
        b[2] += r.breached()
    return bins


def plot(name: str, workload: Workload, found: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    times = [float(t) for t in range(int(workload.seconds))]
    top.plot(times, [workload.rate(t) for t in times], color="black")
    top.set_ylabel("arrival rate (req/s)")
    for arm in found["arms"]:
        counts = [(max(t, 0.0), n) for t, n, _ in arm["replicas_over_time"]]
        counts.append((workload.seconds, counts[-1][1]))
        width = 2.5 if arm["name"] == "planner" else 1.0
        mid.step(
            [t for t, _ in counts],
            [n for _, n in counts],
            where="post",
            label=arm["name"],
            linewidth=width,
        )
        series = arm["breaches_over_time"]
        share = [100 * (1 - b / n) if n else 100.0 for _, n, b in series]
        bottom.plot([t for t, _, _ in series], share, label=arm["name"], linewidth=width)
    mid.set_ylabel("replicas holding a GPU")
    mid.set_xlim(0, workload.seconds)
    bottom.set_ylabel("% meeting SLA (10 s bins)")
    bottom.set_xlabel("simulated seconds since the load started")
    mid.legend(loc="upper left", fontsize=7, ncol=4)
    promoted = f"promoted in {found.get('promotion_s', 1.0):g} s"
    spares = f", {found['spares']} warm spare(s) {promoted}" if found.get("spares") else ""
    fig.suptitle(
        f"{name}: {workload.title}\nLlama-3.1-8B on H100 (AI Configurator timing), start-up "
        f"{found['startup_s']:.1f} s{spares}; TTFT {TTFT_S:g} s, mean ITL {ITL_S * 1e3:g} ms",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def verdict(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal, checked: against the cheapest static arm costing at least the
    planner, >= 80% fewer breaches at <= 0.95x its GPU-seconds; and no more GPU-seconds
    than the smallest static size meeting the SLA for 99% of requests."""
    planner = next(a for a in arms if a["name"] == "planner")
    static = sorted((a for a in arms if a["name"] != "planner"), key=lambda a: a["gpu_s"])
    peer = next((a for a in static if a["gpu_s"] >= planner["gpu_s"]), None)
    good = next((a for a in static if a["breaches"] <= 0.01 * a["requests"]), None)
    out: dict[str, Any] = {
        "planner_sla_met": round(1 - planner["breaches"] / planner["requests"], 4)
    }
    if peer is not None:
        fewer = 1 - planner["breaches"] / peer["breaches"] if peer["breaches"] else None
        out["peer"] = peer["name"]
        out["fewer_breaches_than_peer"] = None if fewer is None else round(fewer, 3)
        out["gpu_s_ratio_to_peer"] = round(planner["gpu_s"] / peer["gpu_s"], 3)
        fewer_enough = planner["breaches"] == 0 or (fewer is not None and fewer >= 0.8)
        out["meets_peer_goal"] = fewer_enough and out["gpu_s_ratio_to_peer"] <= 0.95
    if good is not None:
        out["smallest_static_at_99"] = good["name"]
        out["gpu_s_ratio_to_smallest_at_99"] = round(planner["gpu_s"] / good["gpu_s"], 3)
        out["within_smallest_at_99"] = planner["gpu_s"] <= good["gpu_s"]
    return out


def run_workload(
    name: str, mode: str, kept: list[dict[str, Any]], arm_names: list[str], timing: AicTiming
) -> dict[str, Any]:
    """One workload under one start-up mode: ``arm_names`` run, the other arms of ``kept``
    kept (the static arms' figures do not depend on the planner's start-up mode)."""
    workload, start = WORKLOADS[name], START_MODES[mode]
    load = arrivals(workload, seed=11)
    arms = [a for a in kept if a["name"] not in arm_names]
    for arm in arm_names:
        t0 = time.monotonic()
        arms.append(asyncio.run(run_arm(arm, load, workload.seconds, timing, start)))
        row = {k: v for k, v in arms[-1].items() if not k.endswith("time") and k != "decisions"}
        print(f"{name}/{mode} {row} in {time.monotonic() - t0:.0f} s", flush=True)
    arms.sort(key=lambda a: (a["name"] != "planner", a["name"]))
    config = MockerConfig.from_options({**ENGINE_ARGS, **start.engine_args})
    found = {
        "startup_s": round(Startup(config).expected_s, 1),
        "title": workload.title,
        "arms": arms,
        "goal": verdict(arms),
    }
    if start.spares:
        found.update(spares=start.spares, promotion_s=start.promotion_s)
    print(name, mode, json.dumps(found["goal"]), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", nargs="*", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument(
        "--startup", nargs="*", choices=list(START_MODES), default=list(START_MODES),
        help="the planner arm's start-up modes; cold's results go under \"workloads\", "
        "the others' under \"startups\"",
    )  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/planner.json")
    parser.add_argument("--plots", default="docs/img")
    parser.add_argument(
        "--arms", nargs="*", help="only these arms (planner, static-N); the others are kept "
        "from --out (static arms are deterministic: the same code gives the same figures)",
    )  # fmt: skip
    parser.add_argument("--plot-only", action="store_true", help="redraw the plots of --out")
    args = parser.parse_args()
    path = Path(args.out)
    result = json.loads(path.read_text()) if path.exists() else {}
    result.setdefault("workloads", {})
    result.setdefault("startups", {})
    if args.plot_only:
        for mode, name, found in _results(result):
            plot(name, WORKLOADS[name], found, _plot_path(args.plots, name, mode))
        return
    began, load_before = time.monotonic(), os.getloadavg()
    timing = AicTiming.build(MockerConfig.from_options(ENGINE_ARGS))
    names = args.arms or ["planner", *(f"static-{n}" for n in range(1, MAX_REPLICAS + 1))]
    for mode in args.startup:
        into = result["workloads"] if mode == "cold" else result["startups"].setdefault(
            mode, {"title": START_MODES[mode].title, "workloads": {}})["workloads"]  # fmt: skip
        for name in args.workload:
            cold = result["workloads"].get(name, {}).get("arms", [])
            kept = into.get(name, {}).get("arms", []) or cold
            static = [a for a in cold if a["name"] != "planner"]  # the cold run's, kept
            arm_names = names if mode == "cold" else ["planner"]
            if mode != "cold":
                kept = [*static, *(a for a in kept if a["name"] == "planner")]
            into[name] = run_workload(name, mode, kept, arm_names, timing)
            plot(name, WORKLOADS[name], into[name], _plot_path(args.plots, name, mode))
    result.update(
        machine=machine(),
        load_average=[round(x, 2) for x in (*load_before, *os.getloadavg())],
        wall_s=round(time.monotonic() - began),
        model=f"{MODEL} on {SYSTEM}, TP 1, AI Configurator timing (perf-model: aic)",
        targets={"ttft_s": TTFT_S, "mean_itl_s": ITL_S},
        lengths={"isl": list(ISL), "osl": list(OSL)},
        planner=SETTINGS.model_dump(exclude_defaults=True),
        engine_args=ENGINE_ARGS,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


def _results(result: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(start-up mode, workload, its results) of every run in ``result``."""
    found = [("cold", name, w) for name, w in result["workloads"].items()]
    for mode, run in result["startups"].items():
        found += [(mode, name, w) for name, w in run["workloads"].items()]
    return found


def _plot_path(folder: str, name: str, mode: str) -> Path:
    suffix = "" if mode == "cold" else "_" + mode.replace("+", "_")
    return Path(folder) / f"planner_{name}{suffix}.png"


if __name__ == "__main__":
    main()
