"""What the request plane costs per stream, client and server, for two commits side by
side in one run.

    python benchmarks/request_plane.py 9660cf0 main [--streams 6000] [--concurrency 32]
        [--chunks 6] [--repeat 5] [--out benchmarks/results/request_plane.json]

A frontend opens one stream per request on a worker's ``RequestServer`` and reads its
chunks; the worker's handler yields them. Here one server process (a handler yielding
``--chunks`` chunks of 24 bytes, what the mocker sends for a 16-token completion) and one
client process (``--concurrency`` tasks opening ``--streams`` streams in all, each read to
its end) from the commit's tree talk over TCP on 127.0.0.1; each process reports its own
CPU time (``time.process_time``: every thread, ZeroMQ's I/O thread too) per stream. The
commits alternate for ``--repeat`` runs; reported is each commit's median.
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

_SERVE = """
import asyncio, json, sys, time
from dynamoctl.planes.request import RequestServer

async def main(chunks: int) -> None:
    async def handler(body: bytes):
        for i in range(chunks):
            yield b"%024d" % i

    async with RequestServer("tcp://127.0.0.1:0") as server:
        server.register("generate", handler)
        print(server.address, flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)  # the client starts: go
        started = time.process_time()
        await loop.run_in_executor(None, sys.stdin.readline)  # the client is done
        print(json.dumps({"cpu_s": time.process_time() - started}), flush=True)

asyncio.run(main(int(sys.argv[1])))
"""

_CLIENT = """
import asyncio, json, sys, time
from dynamoctl.planes.request import RequestClient

async def main(address: str, streams: int, concurrency: int, chunks: int) -> None:
    async with RequestClient() as client:
        await client.connect(address)
        left = [streams]

        async def one_after_another() -> None:
            while left[0] > 0:
                left[0] -= 1
                got = [c async for c in client.stream(address, "generate", b"x" * 64)]
                assert len(got) == chunks, len(got)

        for _ in range(3):  # warm the connection and the code paths
            _ = [c async for c in client.stream(address, "generate", b"")]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.process_time()
        await asyncio.gather(*(one_after_another() for _ in range(concurrency)))
        print(json.dumps({"cpu_s": time.process_time() - started}), flush=True)

asyncio.run(main(sys.argv[1], *map(int, sys.argv[2:5])))
"""


def run_once(tree: Path, streams: int, concurrency: int, chunks: int) -> dict[str, float]:
    """Client's and server's CPU microseconds per stream, processes from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    spawn = {"env": env, "cwd": tree, "text": True, "stdin": subprocess.PIPE,
             "stdout": subprocess.PIPE}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(chunks)], **spawn)
    client: subprocess.Popen[str] | None = None
    try:
        address = server.stdout.readline().strip()
        args = [address, str(streams), str(concurrency), str(chunks)]
        client = subprocess.Popen([sys.executable, "-c", _CLIENT, *args], **spawn)
        assert client.stdout.readline().strip() == "ready"
        for proc in (server, client):
            proc.stdin.write("go\n")
            proc.stdin.flush()
        client_cpu = json.loads(client.stdout.readline())["cpu_s"]
        server.stdin.write("done\n")
        server.stdin.flush()
        server_cpu = json.loads(server.stdout.readline())["cpu_s"]
        return {"client_us": client_cpu * 1e6 / streams, "server_us": server_cpu * 1e6 / streams}
    finally:
        for proc in (server, client):
            if proc is not None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--streams", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/request_plane.json")
    args = parser.parse_args()

    def run(tree: Path) -> dict[str, float]:
        return run_once(tree, args.streams, args.concurrency, args.chunks)

    runs = alternating(args.base, args.head, args.repeat, run, prefix="request-plane-")
    median = {
        name: {side: round(statistics.median(r[side] for r in rs), 1)
               for side in ("client_us", "server_us")}
        for name, rs in runs.items()
    }  # fmt: skip
    report = {
        "machine": machine(),
        "base": args.base,
        "head": args.head,
        "streams": args.streams,
        "concurrency": args.concurrency,
        "chunks_per_stream": args.chunks,
        "repeat": args.repeat,
        "cpu_us_per_stream": {
            name: [{k: round(v, 1) for k, v in r.items()} for r in rs] for name, rs in runs.items()
        },
        "cpu_us_per_stream_median": median,
        "head_over_base": {
            side: round(median[args.head][side] / median[args.base][side], 3)
            for side in ("client_us", "server_us")
        },
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.head} over {args.base}: client x{report['head_over_base']['client_us']}, "
          f"server x{report['head_over_base']['server_us']}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
