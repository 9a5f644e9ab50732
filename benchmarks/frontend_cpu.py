"""A frontend's CPU per request with nothing competing for the cores: dynamoctl at one or
more commits and NVIDIA Dynamo 1.6.1, each serving the multiturn workload one request at
a time, side by side in one run.

    benchmarks/dynamo/install.sh     # once: Dynamo into benchmarks/.dynamo-venv
    python benchmarks/frontend_cpu.py [--commits 80fc306,HEAD] [--conversations 10]
                                      [--rounds 3] [--no-dynamo]

benchmarks/dynamo_compare.py's closed-loop load keeps both cores of this machine busy even
at concurrency 1 (its load generator parses every SSE line, the workers and the frontend
take turns on the cores), so the CPU a frontend spends per request there is also what the
contention costs, and it moves with the scheduler's shares. Here one light client
(``http.client``, each streamed answer read whole) sends 8-turn conversations of the
multiturn workload (benchmarks/agentic.py: a 32k-token history, 200 new tokens and 200
answer tokens a turn), one request after the other; the frontend's process CPU, and its
main thread's, is read around them. Each conversation is new to the frontend (the first
turn has nothing in a prefix cache); two conversations warm each deployment up first and
are not counted. The same deployment as dynamo_compare.py (4 mocker workers at speedup
1000 in one process, KV routing, block size 16), in a network namespace of its own. The
systems alternate for ``--rounds`` rounds; per system the median of rounds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import agentic
from commit_compare import DYNAMO, alternating_systems, commands_for, medians
from dynamo_compare import (
    MODEL,
    MULTITURN,
    MULTITURN_TURNS,
    PORT,
    REPO,
    cpu_seconds,
    main_thread_seconds,
    serving,
)
from machine import machine

WARM_CONVERSATIONS = 2


def client(first: int, conversations: int) -> None:
    """Send ``conversations`` conversations (seeds from ``first``), one request at a time."""
    ratio = agentic.tokens_per_word()
    for seed in range(first, first + conversations):
        talk = agentic.Conversation(seed, ratio, *MULTITURN, MODEL)
        for _ in range(MULTITURN_TURNS):
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
            conn.request("POST", "/v1/chat/completions", talk.next_turn(),
                         {"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or b"data: [DONE]" not in body:
                raise SystemExit(f"request failed: {response.status} {body[:200]!r}")
            conn.close()


def measure(tree: Path | None, venv: Path, conversations: int) -> dict[str, float]:
    """One deployment (dynamoctl from ``tree``, or Dynamo): CPU per request."""
    with tempfile.TemporaryDirectory() as tmp:
        commands, env = commands_for(tmp, tree, venv)
        with serving(f"fe-cpu-{os.getpid()}", commands, env, tmp) as (prefix, frontend, _):
            seeds = (os.getpid() << 32) + int(time.time() * 1000) % (1 << 30)

            def send(first: int, count: int) -> None:
                subprocess.run([*prefix, sys.executable, __file__, "--client", str(first),
                                str(count)], check=True)  # fmt: skip

            send(seeds, WARM_CONVERSATIONS)
            cpu, main = cpu_seconds(frontend), main_thread_seconds(frontend)
            began = time.monotonic()
            send(seeds + WARM_CONVERSATIONS, conversations)
            wall = time.monotonic() - began
            cpu, main = cpu_seconds(frontend) - cpu, main_thread_seconds(frontend) - main
    requests = conversations * MULTITURN_TURNS
    return {
        "requests": requests,
        "frontend_cpu_ms_per_req": round(cpu * 1e3 / requests, 3),
        "frontend_main_thread_cpu_ms_per_req": round(main * 1e3 / requests, 3),
        "wall_ms_per_req": round(wall * 1e3 / requests, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", default="HEAD", help="dynamoctl commits, comma-separated")
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-dynamo", action="store_true")
    parser.add_argument("--dynamo-venv", type=Path, default=REPO / "benchmarks" / ".dynamo-venv")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "frontend_cpu.json"
    )
    parser.add_argument("--client", nargs=2, type=int, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    if args.client:
        client(*args.client)
        return
    commits = args.commits.split(",")
    load_before = os.getloadavg()
    runs = alternating_systems(
        commits,
        not args.no_dynamo,
        args.rounds,
        lambda tree: measure(tree, args.dynamo_venv, args.conversations),
        "frontend-cpu-",
    )
    by_system = medians(runs, 3)
    report = {
        "machine": machine(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "workload": f"{MULTITURN_TURNS}-turn conversations, one request at a time "
        f"(history, new, answer tokens: {MULTITURN})",
        "conversations": args.conversations,
        "rounds": runs,
        "medians": by_system,
    }
    if DYNAMO in by_system:
        theirs = by_system[DYNAMO]["frontend_cpu_ms_per_req"]
        report["cpu_per_req_over_dynamo"] = {
            c: round(by_system[c]["frontend_cpu_ms_per_req"] / theirs, 3) for c in commits
        }
        print("CPU per request over Dynamo's:", report["cpu_per_req_over_dynamo"])
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
