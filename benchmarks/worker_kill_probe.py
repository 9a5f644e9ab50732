"""Worker-kill probe: what streaming clients notice when a worker is SIGKILLed every 5 s.

    python benchmarks/worker_kill_probe.py [--calm 30] [--seconds 60] [--kill-every 5]
        [--concurrency 24] [--out benchmarks/results/worker_kill_probe.json]

``dynamoctl up`` of a local recipe (3 mocker workers, kv router) in a private
``DYNAMOCTL_HOME``; a closed loop of ``--concurrency`` streaming requests for ``--calm``
seconds without kills, then for ``--seconds`` with one worker process (the keeper's child:
agg-0, agg-1, ... in turn, skipping one that is not READY) SIGKILLed every
``--kill-every`` seconds. Each phase reports failed requests, the stream gap (the longest
silence between two content chunks inside each stream) p50/p99/max, TTFT p50/p99/max,
and the frontend's migrations, counting those that carried 0 tokens (read from its log:
a stream sent to a worker that was already dead). Run it against another checkout with
``PYTHONPATH=/that/checkout`` (every process ``up`` starts inherits it): that is how the
"before" row was measured (docs/benchmarks.md).

``--fault`` chooses what happens to the worker process (issue 26): ``kill`` (SIGKILL),
``wedge`` (SIGSTOP, never resumed: sockets open, nothing answers, as a hung engine) or
``freeze`` (SIGSTOP, then SIGCONT after ``--freeze-for`` seconds: a transient stall that
must cost no restart). A sampler polls ``status`` every 0.25 s and records, per wedged
process, how long its row still showed it READY, and the states it went through; the
phase reports the supervisor's restarts (``status``) against the faults injected, and
leftover stopped processes (wedged and never replaced) are counted, then SIGKILLed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from chaos import dynamoctl as run_dynamoctl
from chaos import free_port, scrape
from probes import MODEL, mocker_recipe, stream_summary

from dynamoctl.bench.client import Sender
from dynamoctl.bench.clock import LoopClock
from dynamoctl.bench.http import Endpoint
from dynamoctl.bench.schedule import Limits, drive
from dynamoctl.bench.workload import LengthDist, synthetic_sessions

NAME = "killprobe"
WORKERS = 3
MIGRATION_LINE = re.compile(r"worker (\S+) .*failed \((.*)\); migrating with (\d+) tokens")


class Killer:
    """Injects ``fault`` into one READY worker process every ``every`` seconds, in turn,
    and samples ``status`` meanwhile (how long a wedged process still shows READY)."""

    def __init__(
        self, control: str, token: str, clock: LoopClock, fault: str, freeze_for: float
    ) -> None:
        # A new connection per call: kills come every 5 s, uvicorn closes a connection
        # idle for 5 s, and a reused one can be closed under the request.
        self.http = httpx.AsyncClient(
            base_url=control, trust_env=False, timeout=10,
            headers={"authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_keepalive_connections=0),
        )  # fmt: skip
        self.clock = clock
        self.fault, self.freeze_for = fault, freeze_for
        self.kills: list[dict[str, Any]] = []
        self.stopped: dict[int, dict[str, Any]] = {}
        """Wedged (SIGSTOPped, not resumed) processes: pid -> their fault record."""
        self._resumes: set[asyncio.Task[None]] = set()

    async def rows(self) -> list[dict[str, Any]]:
        rows = (await self.http.get("/status")).json()["instances"]
        return sorted((r for r in rows if r["name"].startswith("agg-")), key=lambda r: r["name"])

    async def kill_one(self, turn: int, origin: float) -> None:
        workers = await self.rows()
        count = len(workers)
        for row in workers[turn % count :] + workers[: turn % count]:
            if row["state"] != "READY" or not row["pid"]:
                continue
            children = psutil.Process(row["pid"]).children()
            if not children or children[0].pid in self.stopped:
                continue
            pid = children[0].pid
            os.kill(pid, signal.SIGKILL if self.fault == "kill" else signal.SIGSTOP)
            at = round(self.clock.now() - origin, 3)
            record = {"instance": row["name"], "at_s": at, "pid": pid, "keeper": row["pid"]}
            self.kills.append(record)
            if self.fault == "wedge":
                record |= {"ready_after_s": 0.0, "states": ["READY"], "since": self.clock.now()}
                self.stopped[pid] = record
            elif self.fault == "freeze":
                task = asyncio.create_task(self._resume(pid))
                self._resumes.add(task)
                task.add_done_callback(self._resumes.discard)
            return

    async def _resume(self, pid: int) -> None:
        await asyncio.sleep(self.freeze_for)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    async def sample(self) -> None:
        """How long each wedged process's row still says READY (same keeper pid), and
        the states it shows until its instance is replaced."""
        while True:
            await asyncio.sleep(0.25)
            with contextlib.suppress(httpx.HTTPError):
                rows = {r["name"]: r for r in await self.rows()}
                for record in self.stopped.values():
                    row = rows.get(record["instance"])
                    if row is None or (row["pid"] != record["keeper"] and row["pid"]):
                        continue  # replaced by a new process
                    if row["state"] != record["states"][-1]:
                        record["states"].append(row["state"])
                    if row["state"] == "READY" and len(record["states"]) == 1:
                        record["ready_after_s"] = round(self.clock.now() - record["since"], 2)

    async def run(self, origin: float, every: float, seconds: float) -> None:
        sampler = asyncio.create_task(self.sample())
        turn = 0
        try:
            while (due := origin + every * (turn + 1)) < origin + seconds - 1:
                await asyncio.sleep(max(0.0, due - self.clock.now()))
                await self.kill_one(turn, origin)
                turn += 1
            await asyncio.sleep(max(0.0, origin + seconds - self.clock.now()))
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, *self._resumes, return_exceptions=True)

    def leftovers(self) -> int:
        """Wedged processes still there, stopped: never replaced. SIGKILLed now."""
        left = 0
        for pid in self.stopped:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                    left += 1
                    os.kill(pid, signal.SIGKILL)
        return left

    async def close(self) -> None:
        await self.http.aclose()


def migrations_in_log(log: Path, skip_bytes: int) -> dict[str, Any]:
    """The frontend's migration lines after ``skip_bytes``: how many, how many with 0
    tokens, and why the old worker's stream failed (first words of the error)."""
    text = log.read_bytes()[skip_bytes:].decode(errors="replace")
    found = [m.groups() for m in MIGRATION_LINE.finditer(text)]
    why: dict[str, int] = {}
    for _, error, _ in found:
        key = re.sub(r"\d+(\.\d+)?s\b", "Ns", re.sub(r"tcp://\S+", "ADDR", error))
        key = " ".join(key.split()[:6])
        why[key] = why.get(key, 0) + 1
    return {
        "migrations": len(found),
        "zero_token_migrations": sum(1 for *_, tokens in found if tokens == "0"),
        "why": why,
    }


async def run_phase(
    args: argparse.Namespace, url: str, seconds: float, killer: Killer | None, seed: int
) -> dict[str, Any]:
    clock = LoopClock()
    endpoint = Endpoint(url)
    sender = Sender(endpoint, MODEL, clock, timeout=60)
    sessions = synthetic_sessions(
        LengthDist.parse(str(args.isl)), LengthDist.parse(str(args.osl)), seed=seed
    )
    origin = clock.now()
    task = None if killer is None else asyncio.create_task(
        killer.run(origin, args.kill_every, seconds)
    )  # fmt: skip
    outcome = await drive(
        sessions, sender.send, clock=clock, concurrency=args.concurrency,
        limits=Limits(10**9, seconds, 30),
    )  # fmt: skip
    if task is not None:
        await task
    await endpoint.close()
    return stream_summary(outcome.records, outcome.unfinished)


async def probe(args: argparse.Namespace, url: str, state: dict[str, Any], log: Path) -> Any:
    phases: dict[str, Any] = {}
    http = httpx.AsyncClient(trust_env=False, timeout=10)
    migrations = "dynamoctl_frontend_migrations_total"
    killer = Killer(state["control"], state["token"], LoopClock(), args.fault, args.freeze_for)
    try:
        for name, seconds, kill in (("calm", args.calm, False), ("kills", args.seconds, True)):
            if seconds <= 0:
                continue
            offset = await asyncio.to_thread(lambda: log.stat().st_size)
            counted = sum((await scrape(http, f"{url}/metrics", migrations)).values())
            found = await run_phase(args, url, seconds, killer if kill else None, seed=len(phases))
            counted = sum((await scrape(http, f"{url}/metrics", migrations)).values()) - counted
            found |= migrations_in_log(log, offset)
            found["migrations_metric"] = counted
            if kill:
                found |= await fault_outcome(killer)
            phases[name] = found
            print(name, json.dumps({k: v for k, v in found.items() if k != "kills"}), flush=True)
    finally:
        await killer.close()
        await http.aclose()
    return phases


async def fault_outcome(killer: Killer) -> dict[str, Any]:
    """What the supervisor made of the faults: restarts against faults, the longest a
    wedged process still showed READY, and wedged processes never replaced."""
    rows = await killer.rows()
    wedged = list(killer.stopped.values())
    for record in wedged:
        record.pop("since", None)
    return {
        "faults": len(killer.kills),
        "restarts": sum(r["restarts"] for r in rows),
        "messages": sorted({r["message"] for r in rows} - {""}),
        "longest_ready_while_wedged_s": max((r["ready_after_s"] for r in wedged), default=None),
        "wedged_never_replaced": killer.leftovers(),
        "states_at_end": {r["name"]: r["state"] for r in rows},
        "kills": killer.kills,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calm", type=float, default=30.0, help="seconds of load without kills")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load with kills")
    parser.add_argument("--kill-every", type=float, default=5.0)
    parser.add_argument("--fault", choices=("kill", "wedge", "freeze"), default="kill")
    parser.add_argument("--freeze-for", type=float, default=3.0, help="seconds (freeze)")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--isl", type=int, default=256)
    parser.add_argument("--osl", type=int, default=128)
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--label", default="", help="what code ran (e.g. before/after)")
    parser.add_argument("--code", default="", help="the commit that ran (recorded as given)")
    parser.add_argument("--out", default="benchmarks/results/worker_kill_probe.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynamoctl-killprobe-") as tmp:
        home, port = Path(tmp) / "home", free_port()
        recipe = Path(tmp) / "probe.yaml"
        recipe.write_text(mocker_recipe(NAME, port, args.workers, args.speedup))
        up = run_dynamoctl(home, "up", str(recipe), "--detach")
        if up.returncode != 0:
            sys.exit(f"up failed:\n{up.stderr}")
        try:
            state = json.loads((home / "runs" / NAME / "state.json").read_text())
            log = home / "runs" / NAME / "logs" / "frontend-0.log"
            if not log.exists():
                log = next((home / "runs" / NAME / "logs").glob("frontend*.log"))
            phases = asyncio.run(probe(args, f"http://127.0.0.1:{port}", state, log))
        finally:
            down = run_dynamoctl(home, "down", NAME)
            if down.returncode != 0:
                print(down.stderr, file=sys.stderr)
    result = {
        "label": args.label,
        "code": args.code or "not given (--code)",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "note": "shared with other jobs running tests: figures are noisy",
        },
        "deployment": f"dynamoctl up (local): {args.workers} mocker workers (speedup "
        f"{args.speedup:g}, 4096 blocks of 16), kv router, shipped supervision defaults",
        "workload": {
            "concurrency": args.concurrency,
            "isl": args.isl,
            "osl": args.osl,
            "calm_s": args.calm,
            "kills_s": args.seconds,
            "kill_every_s": args.kill_every,
            "fault": args.fault,
            "freeze_for_s": args.freeze_for if args.fault == "freeze" else None,
        },
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **phases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
