"""dynamoctl vs NVIDIA Dynamo 1.6.1, side by side in one run, same machine, same load.

    benchmarks/dynamo/install.sh                 # once: Dynamo into benchmarks/.dynamo-venv
    python benchmarks/dynamo_compare.py [--concurrency 1,8,32,128] [--seconds 5] [--rounds 2]

Each system gets the same deployment: one frontend with KV routing (block size 16) and 4
mocker workers at speedup 1000 in one process, file-based/embedded discovery, serving the
same model directory (dynamoctl's builtin tokenizer, which is an HF-style model dir). Each
runs in a network namespace of its own with only loopback up (Dynamo's mocker binds some
ZMQ sockets on 0.0.0.0), and the load generator runs inside that namespace: closed-loop
clients sending streamed 16-token completions (`ignore_eos`), one new connection per
request, a one-write raw HTTP/1.1 client (see benchmarks/frontend.py for why not httpx).
The systems alternate for ``--rounds`` rounds so drift on the machine hits both. Needs root
(``ip netns``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import agentic
import psutil

MODEL = "mock-llama"
PORT = 8000
SHORT_TOKENS = 16
"""Tokens of each streamed completion of the short workload."""
MULTITURN = (32_000, 200, 200)
"""The long-context multi-turn workload (``--workload multiturn``, benchmarks/agentic.py):
tokens of history a conversation starts with, new user tokens a turn, answer tokens."""
MULTITURN_TURNS = 8
WORKLOADS = {
    "short": "streamed completions, 16 tokens, 4 mocker workers at speedup 1000, kv router",
    "multiturn": "streamed chat completions of 8-turn conversations from a 32k-token history, "
    "200 new user tokens and 200 answer tokens a turn, 4 mocker workers at speedup 1000, "
    "kv router",
}
REPO = Path(__file__).resolve().parents[1]


# -- the load generator (runs inside the namespace: ``--load``) ------------------------------


async def stream_once(
    port: int, payload: bytes, path: bytes = b"/v1/completions"
) -> tuple[float, float, bool, int]:
    """One streamed request: (TTFT, end-to-end, succeeded, streamed chunks)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST " + path + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
            + payload
        )  # fmt: skip
        status = await reader.readline()
        first: float | None = None
        done = False
        chunks = 0
        while line := await reader.readline():
            if line.startswith(b"data: {"):
                chunks += 1
                if first is None:
                    first = time.monotonic()
            if line.startswith(b"data: [DONE]"):
                done = True
                break
        end = time.monotonic()
        return (first or end) - start, end - start, done and b" 200 " in status, chunks
    finally:
        writer.close()


def requests_of(workload: str, client: int) -> Iterator[tuple[bytes, bytes]]:
    """(path, body) of a client's requests, endlessly."""
    if workload == "short":
        body = {"model": MODEL, "prompt": "benchmark prompt", "max_tokens": SHORT_TOKENS,
                "stream": True, "ignore_eos": True}  # fmt: skip
        payload = json.dumps(body).encode()
        while True:
            yield b"/v1/completions", payload
    ratio = agentic.tokens_per_word()
    # Conversations no earlier load run had (the warm-up pass, a lower level): a prefix
    # cache must not find a first turn it has seen, as it would not for a new agent.
    first = (os.getpid() << 32) + client * 100_000
    for n in itertools.count():
        talk = agentic.Conversation(first + n, ratio, *MULTITURN, MODEL)
        for _ in range(MULTITURN_TURNS):
            yield b"/v1/chat/completions", talk.next_turn()


async def load(port: int, concurrency: int, seconds: float, workload: str) -> dict[str, float]:
    ttfts: list[float] = []
    e2es: list[float] = []
    errors = 0
    events = 0
    stop_at = time.monotonic() + seconds

    async def client(index: int) -> None:
        nonlocal errors, events
        bodies = requests_of(workload, index)
        while time.monotonic() < stop_at:
            path, payload = next(bodies)
            try:
                ttft, e2e, ok, chunks = await stream_once(port, payload, path)
            except OSError:
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if ok:
                ttfts.append(ttft)
                e2es.append(e2e)
                events += chunks
            else:
                errors += 1

    began = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    wall = time.monotonic() - began
    return {
        "concurrency": concurrency,
        "requests": len(e2es),
        "tokens": len(e2es) * (MULTITURN[2] if workload == "multiturn" else SHORT_TOKENS),
        "sse_events": events,
        "errors": errors,
        "req_per_s": round(len(e2es) / wall, 1),
        **percentiles("ttft", ttfts),
        **percentiles("e2e", e2es),
    }


def percentiles(name: str, seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds) or [float("nan")]
    return {
        f"{name}_p50_ms": round(statistics.median(ordered) * 1e3, 2),
        f"{name}_p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3, 2),
    }


# -- the systems ---------------------------------------------------------------------------------


def netns(name: str) -> list[str]:
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    return ["ip", "netns", "exec", name]


def model_dir(tmp: str) -> str:
    """dynamoctl's builtin tokenizer as an HF model dir; Dynamo also wants ``architectures``."""
    builtin = resources.files("dynamoctl.tokenizer").joinpath("builtin")
    out = Path(tmp) / "model"
    out.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (out / name).write_text(builtin.joinpath(name).read_text())
    config = json.loads((out / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.setdefault("model_type", "llama")
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def dynamoctl_commands(tmp: str) -> tuple[list[list[str]], dict[str, str]]:
    common = ["--namespace", "bench", "--discovery", f"embedded://{tmp}"]
    worker = [sys.executable, "-m", "dynamoctl", "worker", *common, "--num-workers", "4",
              "--model", MODEL, "--block-size", "16", "--speedup-ratio", "1000"]  # fmt: skip
    frontend = [sys.executable, "-m", "dynamoctl", "frontend", *common, "--port", str(PORT),
                "--router-mode", "kv"]  # fmt: skip
    return [worker, frontend], {}


def dynamo_commands(tmp: str, venv: Path) -> tuple[list[list[str]], dict[str, str]]:
    python = str(venv / "bin" / "python")
    worker = [python, "-m", "dynamo.mocker", "--model-path", model_dir(tmp), "--model-name", MODEL,
              "--num-workers", "4", "--speedup-ratio", "1000", "--block-size", "16"]  # fmt: skip
    frontend = [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port",
                str(PORT), "--router-mode", "kv", "--kv-cache-block-size", "16"]  # fmt: skip
    return [worker, frontend], {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": tmp}


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU time of ``proc`` and its descendants (a frontend may run helper processes)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def main_thread_seconds(proc: psutil.Process) -> float:
    """CPU time of ``proc``'s main thread (its id is the process's)."""
    try:
        return next((t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid), 0.0)
    except psutil.Error:
        return 0.0


def wait_serving(prefix: list[str], timeout: float = 120) -> None:
    probe = (
        "import json,sys,urllib.request as u;"
        f"d=json.load(u.urlopen('http://127.0.0.1:{PORT}/v1/models',timeout=2));"
        f"sys.exit(0 if any(m['id']=='{MODEL}' for m in d['data']) else 1)"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True).returncode
            == 0
        ):
            return
        time.sleep(0.5)
    raise TimeoutError("the system did not list the model")


def measure(
    system: str, levels: list[int], seconds: float, venv: Path, workload: str = "short"
) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        commands, extra = (
            dynamo_commands(tmp, venv) if system == "dynamo" else dynamoctl_commands(tmp)
        )
        load_args = ["--workload", workload]
        return serve_and_load(
            f"cmp-{system}-{os.getpid()}", commands, extra, levels, seconds, tmp, load_args
        )


@contextlib.contextmanager
def serving(
    name: str, commands: list[list[str]], extra_env: dict[str, str], tmp: str
) -> Iterator[tuple[list[str], psutil.Process, list[psutil.Process]]]:
    """``commands`` (the frontend last) started in network namespace ``name`` and serving:
    the namespace's command prefix, the frontend's process and the others'. Their logs
    are printed if the body raises; all are stopped and the namespace deleted after."""
    prefix = netns(name)
    env = {**os.environ, **extra_env}
    logs = [open(Path(tmp) / f"{i}.log", "wb") for i in range(len(commands))]  # noqa: SIM115
    procs = [
        subprocess.Popen([*prefix, *cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
        for cmd, log in zip(commands, logs, strict=True)
    ]
    try:
        wait_serving(prefix)
        # `ip netns exec` execs the command: these are the processes themselves
        yield prefix, psutil.Process(procs[-1].pid), [psutil.Process(p.pid) for p in procs[:-1]]
    except BaseException:
        for log in logs:
            log.flush()
            print(Path(log.name).read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def serve_and_load(
    name: str,
    commands: list[list[str]],
    extra_env: dict[str, str],
    levels: list[int],
    seconds: float,
    tmp: str,
    load_args: list[str] | None = None,
    barrier: threading.Barrier | None = None,
) -> list[dict[str, float]]:
    """Start ``commands`` (the frontend last) in network namespace ``name``, run the load at
    each concurrency of ``levels`` inside it, stop them: one row per level, with the
    frontend's CPU per request and per streamed token (``--load`` prints ``tokens``: every
    request asks ``ignore_eos``, so it streams exactly its ``max_tokens``).
    ``barrier``: wait there before each level, to run it at the same time as another
    system's (benchmarks/commit_compare.py ``--together``)."""
    with serving(name, commands, extra_env, tmp) as (prefix, frontend, workers):
        try:
            return [
                load_level(prefix, frontend, workers, level, seconds, load_args, barrier)
                for level in [1, *levels]  # the first c=1 pass warms both up
            ][1:]
        except BaseException:
            if barrier is not None:
                barrier.abort()  # the other system stops waiting for this one
            raise


def load_level(
    prefix: list[str],
    frontend: psutil.Process,
    workers: list[psutil.Process],
    level: int,
    seconds: float,
    load_args: list[str] | None,
    barrier: threading.Barrier | None,
) -> dict[str, float]:
    """One concurrency level of the load, with the frontend's and workers' CPU."""
    if barrier is not None:
        barrier.wait()
    before = cpu_seconds(frontend)
    main_before = main_thread_seconds(frontend)
    workers_before = sum(cpu_seconds(w) for w in workers)
    out = subprocess.run(
        [*prefix, sys.executable, __file__, "--load", str(level), "--seconds",
         str(seconds), *(load_args or [])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row: dict[str, float] = json.loads(out.stdout)
    used = cpu_seconds(frontend) - before
    main_used = main_thread_seconds(frontend) - main_before
    workers_used = sum(cpu_seconds(w) for w in workers) - workers_before
    requests = max(row["requests"], 1)
    row["frontend_cpu_cores"] = round(used / seconds, 2)
    row["frontend_cpu_ms_per_req"] = round(used * 1e3 / requests, 3)
    row["frontend_cpu_us_per_token"] = round(used * 1e6 / max(row["tokens"], 1), 1)
    row["workers_cpu_ms_per_req"] = round(workers_used * 1e3 / requests, 3)
    # The event loop's share: the rest is threads (tokenising, I/O, a runtime's).
    row["frontend_main_thread_cpu_ms_per_req"] = round(main_used * 1e3 / requests, 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dynamo-venv", type=Path, default=REPO / "benchmarks" / ".dynamo-venv")
    parser.add_argument("--out", default="benchmarks/results/dynamo_compare.json")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    parser.add_argument("--load", type=int, help=argparse.SUPPRESS)  # internal: run the load
    args = parser.parse_args()
    if args.load:
        print(json.dumps(asyncio.run(load(PORT, args.load, args.seconds, args.workload))))
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    load_before = os.getloadavg()
    results: dict[str, list[list[dict[str, float]]]] = {"dynamoctl": [], "dynamo": []}
    for round_ in range(args.rounds):
        for system in ("dynamoctl", "dynamo"):
            rows = measure(system, levels, args.seconds, args.dynamo_venv, args.workload)
            results[system].append(rows)
            for row in rows:
                print(
                    f"round {round_} {system:<9} c={row['concurrency']:<4} "
                    f"{row['req_per_s']:>7} req/s  TTFT p50/p99 {row['ttft_p50_ms']}/"
                    f"{row['ttft_p99_ms']} ms  e2e p50/p99 {row['e2e_p50_ms']}/"
                    f"{row['e2e_p99_ms']} ms  frontend {row['frontend_cpu_cores']} cores, "
                    f"{row['frontend_cpu_ms_per_req']} ms/req, "
                    f"{row['frontend_cpu_us_per_token']} us/token  errors {row['errors']}"
                )
    best = {
        system: [
            max((r[i] for r in rounds), key=lambda x: x["req_per_s"]) for i in range(len(levels))
        ]
        for system, rounds in results.items()
    }
    ratio = [
        {
            "concurrency": ours["concurrency"],
            "req_per_s_ratio": round(ours["req_per_s"] / max(theirs["req_per_s"], 1e-9), 2),
            "e2e_p50_ratio": round(ours["e2e_p50_ms"] / max(theirs["e2e_p50_ms"], 1e-9), 2),
            "ttft_p99_ratio": round(ours["ttft_p99_ms"] / max(theirs["ttft_p99_ms"], 1e-9), 2),
            "frontend_cpu_per_req_ratio": round(
                ours["frontend_cpu_ms_per_req"] / max(theirs["frontend_cpu_ms_per_req"], 1e-9), 2
            ),
        }
        for ours, theirs in zip(best["dynamoctl"], best["dynamo"], strict=True)
    ]
    for row in ratio:
        print(f"c={row['concurrency']:<4} dynamoctl/dynamo: req/s x{row['req_per_s_ratio']}, "
              f"e2e p50 x{row['e2e_p50_ratio']}, TTFT p99 x{row['ttft_p99_ratio']}, frontend "
              f"CPU/req x{row['frontend_cpu_per_req_ratio']}")  # fmt: skip
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "workload": WORKLOADS[args.workload],
        "rounds": results,
        "best": best,
        "ratio_dynamoctl_over_dynamo": ratio,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
