"""Where the frontend's CPU goes under the short-stream load, by true CPU (``perf``).

    python benchmarks/frontend_profile.py [--concurrency 32] [--seconds 6]
        [--out benchmarks/results/frontend_profile.json]

The deployment and load of benchmarks/dynamo_compare.py (one frontend with KV routing,
4 mocker workers at speedup 1000, closed-loop clients of streamed 16-token completions,
all in a network namespace). While the load runs, ``perf record`` samples the frontend
process (every thread) at 999 Hz; the result is its CPU split by shared object (the
Python interpreter, the kernel, libzmq, tokenizers, uvloop, ...) and by thread. py-spy
samples wall time, and on a loaded shared machine it counts a thread waiting to be
scheduled (after a syscall that woke another) as busy: perf counts only CPU. Needs root
(``ip netns``, ``perf``); run it under ``flock /tmp/dynamoctl-cluster.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynamo_compare import dynamoctl_commands, netns, wait_serving


def perf_split(data: Path, key: str) -> dict[str, float]:
    """Percent of the samples per ``key`` (dso, comm), as ``perf report`` prints them."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", key, "-g", "none",
         "--stdio"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    split = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%") and not line.startswith("#"):
            split[" ".join(parts[1:])] = float(parts[0].rstrip("%"))
    return split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", default="benchmarks/results/frontend_profile.json")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        name = f"fe-profile-{os.getpid()}"
        prefix = netns(name)
        commands, extra = dynamoctl_commands(tmp)
        env = {**os.environ, **extra}
        logs = [open(Path(tmp) / f"{i}.log", "wb") for i in range(len(commands))]  # noqa: SIM115
        procs = [
            subprocess.Popen([*prefix, *cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
            for cmd, log in zip(commands, logs, strict=True)
        ]
        try:
            wait_serving(prefix)
            load = [*prefix, sys.executable, str(here / "dynamo_compare.py"), "--load"]
            subprocess.run([*load, "1", "--seconds", "2"], capture_output=True, check=True)
            running = subprocess.Popen(
                [*load, str(args.concurrency), "--seconds", str(args.seconds + 2)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(1)  # past the load's start
            data = Path(tmp) / "perf.data"
            subprocess.run(
                ["perf", "record", "-F", "999", "-p", str(procs[-1].pid), "-o", str(data),
                 "--", "sleep", str(args.seconds)],
                capture_output=True, check=True,
            )  # fmt: skip
            row = json.loads(running.communicate()[0])
            by_dso, by_thread = perf_split(data, "dso"), perf_split(data, "comm")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(15)
            for log in logs:
                log.close()
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    result = {
        "machine": platform.node(),
        "load_average": os.getloadavg(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "load": row,
        "frontend_cpu_percent_by_shared_object": by_dso,
        "frontend_cpu_percent_by_thread": by_thread,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
