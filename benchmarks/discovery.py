"""Discovery benchmark: operation latency and how long a killed owner's key outlives it.

    python benchmarks/discovery.py [--out results.json] [--rounds 5]

Starts its own etcd (needs the `etcd` binary) and an embedded store in a temp dir.
Prints a table and writes machine-readable JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynamoctl.discovery import Discovery, EventKind, store_from_url
from dynamoctl.discovery.etcd_server import ManagedEtcd

OWNER = Path(__file__).resolve().parents[1] / "tests" / "discovery" / "owner.py"
TTL = 2.0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def op_latency(url: str, n: int = 500) -> dict[str, float]:
    async with Discovery(store_from_url(url), lease_ttl=10) as disc:
        puts, gets = [], []
        for i in range(n):
            t = time.perf_counter()
            await disc.register(f"bench/k{i % 50}", b"x" * 200)
            puts.append(time.perf_counter() - t)
            t = time.perf_counter()
            await disc.get(f"bench/k{i % 50}")
            gets.append(time.perf_counter() - t)
    return {
        "put_p50_ms": statistics.median(puts) * 1e3,
        "put_p99_ms": pct(puts, 0.99) * 1e3,
        "get_p50_ms": statistics.median(gets) * 1e3,
        "get_p99_ms": pct(gets, 0.99) * 1e3,
    }


async def expiry_after_kill(url: str, rounds: int) -> list[float]:
    """Seconds from SIGKILL of the owner to the watcher seeing its key's DELETE."""
    out = []
    async with Discovery(store_from_url(url), lease_ttl=TTL) as disc:
        for r in range(rounds):
            key = f"expiry/{r}"
            owner = await asyncio.create_subprocess_exec(
                sys.executable, str(OWNER), url, key, "v", str(TTL), stdout=subprocess.PIPE
            )
            assert owner.stdout is not None
            assert (await owner.stdout.readline()).strip() == b"registered"
            events = disc.watch(key)
            assert (await events.__anext__()).kind is EventKind.PUT
            owner.send_signal(signal.SIGKILL)
            await owner.wait()
            killed = time.monotonic()
            event = await asyncio.wait_for(events.__anext__(), TTL * 4)
            assert event.kind is EventKind.DELETE
            out.append(time.monotonic() - killed)
            await events.aclose()
    return out


async def measure(rounds: int) -> dict[str, object]:
    results: dict[str, object] = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "lease_ttl_s": TTL,
    }
    with ManagedEtcd() as etcd, tempfile.TemporaryDirectory() as tmp:
        urls = {"embedded": f"embedded://{tmp}", "etcd": f"etcd://127.0.0.1:{etcd.client_port}"}
        for name, url in urls.items():
            lat = await op_latency(url)
            exp = await expiry_after_kill(url, rounds)
            results[name] = {
                **{k: round(v, 3) for k, v in lat.items()},
                "expiry_after_kill_s": [round(x, 3) for x in exp],
                "expiry_max_over_ttl_s": round(max(exp) - TTL, 3),
            }
            print(
                f"{name:9s} put p50 {lat['put_p50_ms']:.2f} ms p99 {lat['put_p99_ms']:.2f} ms | "
                f"get p50 {lat['get_p50_ms']:.2f} ms | key gone after kill: "
                f"min {min(exp):.2f}s max {max(exp):.2f}s (TTL {TTL}s)"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/discovery.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = asyncio.run(measure(args.rounds))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
