"""What admitting an agent's request costs the mocker: CPU per ``Scheduler.add`` (the
request's checks, its ids packed and its blocks hashed) of long multi-turn prompts, for two
commits side by side in one run.

    python benchmarks/mocker_admit.py 9660cf0 main [--repeat 5]
        [--out benchmarks/results/mocker_admit.json]

The prompts are the multiturn workload's (benchmarks/agentic.py): conversations of a
32k-token history growing by ~400 tokens a turn, 8 turns each, as token ids. Each commit's
tree runs the same script in a process of its own (``PYTHONPATH``); each run adds 64
prompts to one scheduler (each aborted right after, so none is scheduled) and reports CPU
milliseconds per add (``time.process_time``), the commits alternating for ``--repeat``
runs; reported is each commit's median.
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

HISTORY, TURN, TURNS, CONVERSATIONS = 32_000, 400, 8, 8

_ADMIT = """
import json, random, sys, time
from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.scheduler import Scheduler

history, turn, turns, conversations = map(int, sys.argv[1:5])
config = MockerConfig(num_gpu_blocks=1 << 17, block_size=16, enable_chunked_prefill=True)
scheduler = Scheduler(config)
rng = random.Random(0)
prompts = []
for c in range(conversations):
    ids = [rng.randrange(1, 32000) for _ in range(history)]
    for t in range(turns):
        prompts.append(list(ids))
        ids += [rng.randrange(1, 32000) for _ in range(turn)]
spent = 0.0
for i, ids in enumerate(prompts):
    request = GenerateRequest(f"r{i}", ids, 16)
    started = time.process_time()
    scheduler.add(request)
    spent += time.process_time() - started
    scheduler.abort(request.request_id)
print(json.dumps({"adds": len(prompts), "cpu_ms_per_add": spent * 1e3 / len(prompts)}))
"""


def run_once(tree: Path) -> float:
    """CPU milliseconds per add of one process from ``tree``."""
    args = [str(n) for n in (HISTORY, TURN, TURNS, CONVERSATIONS)]
    done = subprocess.run(
        [sys.executable, "-c", _ADMIT, *args], env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(json.loads(done.stdout)["cpu_ms_per_add"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/mocker_admit.json")
    args = parser.parse_args()
    runs = alternating(args.base, args.head, args.repeat, run_once, prefix="mocker-admit-")
    median = {name: round(statistics.median(r), 3) for name, r in runs.items()}
    report = {
        "machine": machine(),
        "base": args.base,
        "head": args.head,
        "prompts": {
            "history_tokens": HISTORY,
            "turn_tokens": TURN,
            "turns": TURNS,
            "conversations": CONVERSATIONS,
        },
        "repeat": args.repeat,
        "cpu_ms_per_add": {name: [round(x, 3) for x in r] for name, r in runs.items()},
        "cpu_ms_per_add_median": median,
        "head_over_base": round(median[args.head] / median[args.base], 3),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.base} {median[args.base]} ms/add, {args.head} {median[args.head]} ms/add: "
          f"x{report['head_over_base']}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
