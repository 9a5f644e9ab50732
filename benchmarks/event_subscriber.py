"""What following KV events costs a router: CPU per event of an ``EventSubscriber``
following 4 publishers, for two commits side by side in one run.

    python benchmarks/event_subscriber.py 0b5664a main [--events 3000] [--rate 500]
        [--repeat 5] [--out benchmarks/results/event_subscriber.json]

A frontend's embedded router (and a standalone one) follows every worker's KV events with
one ``EventSubscriber``; under load each request brings events from its worker. Here 4
publisher processes (``EventPublisher``) each send ``--events`` 200-byte events, one every
1/``--rate`` s (each its own wake-up, as on a router at a few hundred requests a second),
and one subscriber process from the commit's tree reads them all; reported is that
process's CPU time (``time.process_time``: every thread, ZeroMQ's I/O thread too) per
event received, the median of ``--repeat`` runs, the commits alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from commit_compare import alternating
from dynamo_compare import REPO
from machine import machine

PUBLISHERS = 4
PAYLOAD = 200

_PUBLISH = """
import asyncio, sys
from dynamoctl.planes.events.publisher import EventPublisher

async def main(events: int, rate: float, size: int) -> None:
    async with EventPublisher() as pub:
        print(pub.address, pub.replay_address, flush=True)
        sys.stdin.readline()  # the subscriber follows: go
        for _ in range(events):
            pub.publish(b"x" * size)
            await asyncio.sleep(1 / rate)
        sys.stdin.readline()  # the subscriber got everything

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
"""

_SUBSCRIBE = """
import asyncio, json, sys, time
from dynamoctl.planes.events.subscriber import EventSubscriber
from dynamoctl.planes.events.tracker import Event

async def main(expected: int) -> None:
    addresses = [line.split() for line in sys.stdin.readline().split(";")]
    async with EventSubscriber() as sub:
        for i, (address, replay) in enumerate(addresses):
            await sub.add_publisher(f"p{i}", address, replay, curve=False)
        await asyncio.sleep(0.5)  # connected before the first event
        print("ready", flush=True)
        got, started = 0, time.process_time()
        async for item in sub:
            got += isinstance(item, Event)
            if got == expected:
                break
        print(json.dumps({"events": got, "cpu_s": time.process_time() - started}), flush=True)

asyncio.run(main(int(sys.argv[1])))
"""


def run_once(tree: Path, events: int, rate: float) -> float:
    """CPU microseconds per event of one subscriber from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    spawn = {"env": env, "cwd": tree, "text": True, "stdin": subprocess.PIPE,
             "stdout": subprocess.PIPE}  # fmt: skip
    pubs = [
        subprocess.Popen(
            [sys.executable, "-c", _PUBLISH, str(events), str(rate), str(PAYLOAD)], **spawn
        )
        for _ in range(PUBLISHERS)
    ]
    sub = subprocess.Popen([sys.executable, "-c", _SUBSCRIBE, str(events * PUBLISHERS)], **spawn)
    try:
        addresses = [p.stdout.readline().strip() for p in pubs]
        sub.stdin.write(";".join(addresses) + "\n")
        sub.stdin.flush()
        assert sub.stdout.readline().strip() == "ready"
        for p in pubs:
            p.stdin.write("go\n")
            p.stdin.flush()
        result = json.loads(sub.stdout.readline())
        assert result["events"] == events * PUBLISHERS, result
        return float(result["cpu_s"]) * 1e6 / result["events"]
    finally:
        for p in [*pubs, sub]:
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--events", type=int, default=3000, help="per publisher")
    parser.add_argument("--rate", type=float, default=500.0, help="events/s per publisher")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/event_subscriber.json"
    )
    args = parser.parse_args()

    def run(tree: Path) -> float:
        return run_once(tree, args.events, args.rate)

    runs = alternating(args.base, args.head, args.repeat, run, prefix="event-subscriber-")
    median = {name: round(statistics.median(r), 1) for name, r in runs.items()}
    report = {
        "machine": machine(),
        "base": args.base,
        "head": args.head,
        "publishers": PUBLISHERS,
        "events_per_publisher": args.events,
        "rate_per_publisher": args.rate,
        "repeat": args.repeat,
        "cpu_us_per_event": {name: [round(x, 1) for x in r] for name, r in runs.items()},
        "cpu_us_per_event_median": median,
        "head_over_base": round(median[args.head] / median[args.base], 3),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.base} {median[args.base]} us/event, {args.head} {median[args.head]} us/event: "
          f"x{report['head_over_base']}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
