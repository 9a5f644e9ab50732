"""Real ``dynamoctl worker`` and ``dynamoctl frontend`` processes for the benchmarks.

Everything runs on 127.0.0.1 with embedded discovery in a temporary directory, like a
`dynamoctl up` of recipes/local.yaml but with the knobs a benchmark needs (several worker
processes of many mocker instances each, the frontend's router mode).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psutil

from dynamoctl import wire
from dynamoctl.bench.http import Endpoint, get_json_bytes
from dynamoctl.discovery import Discovery, store_from_url

NS = "bench"
MODEL = "mock-llama"


@dataclass
class Cluster:
    url: str
    """The frontend's base URL."""
    frontend: psutil.Process
    workers: list[psutil.Process]
    discovery: str = ""
    """The deployment's discovery URL (to find the workers' /metrics)."""
    frontends: list[psutil.Process] | None = None
    """Every frontend process (``frontend`` is the first)."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _frontend_url(discovery: str, frontends: int = 1) -> str:
    async with Discovery(store_from_url(discovery), lease_ttl=2) as disc:
        for _ in range(600):
            found = await disc.list(f"{NS}/instances/frontend/")
            if len(found) >= frontends:
                return wire.decode_json(next(iter(found.values())), wire.InstanceRecord).address
            await asyncio.sleep(0.1)
    raise TimeoutError("frontend did not register")


async def _wait_served(url: str, instances: int, timeout: float = 120.0) -> None:
    """Until the model is served, then a settle for the router's subscriptions to the
    KV events and load of every instance (it learns them from discovery as well)."""
    endpoint = Endpoint(url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        status, body = await get_json_bytes(endpoint, "/v1/models")
        if status == 200 and MODEL.encode() in body:
            await asyncio.sleep(1.0 + instances / 64)  # subscriptions to every worker
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the model was not served in time")


async def _wait_workers(discovery: str, instances: int, timeout: float = 120.0) -> None:
    async with Discovery(store_from_url(discovery), lease_ttl=2) as disc:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            found = await disc.list(f"{NS}/instances/")
            workers = [k for k in found if "/frontend/" not in k]
            if len(workers) >= instances:
                return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"fewer than {instances} worker instances registered")


@asynccontextmanager
async def cluster(
    *,
    processes: int = 1,
    per_process: int = 4,
    worker_args: list[str] | None = None,
    router_mode: str = "kv",
    frontend_args: list[str] | None = None,
    process_args: list[list[str]] | None = None,
    frontends: int = 1,
    share_bookings: bool = True,
) -> AsyncIterator[Cluster]:
    """``processes`` worker processes of ``per_process`` mocker instances, one frontend
    (``frontends`` > 1: that many on one port, sharing bookings, as ``frontend.processes``
    runs them; ``Cluster.frontend`` is the first).
    ``process_args``: extra arguments of each worker process (e.g. ``--role prefill``);
    it sets the number of processes."""
    groups = process_args if process_args is not None else [[] for _ in range(processes)]
    processes = len(groups)
    with tempfile.TemporaryDirectory() as tmp:
        discovery = f"embedded://{tmp}"
        common = ["--namespace", NS, "--discovery", discovery]
        wargs = ["--num-workers", str(per_process), "--model", MODEL, "--block-size", "16",
                 "--speedup-ratio", "1000", *(worker_args or [])]  # fmt: skip
        logs = os.environ.get("BENCH_LOGS")  # a directory: keep each process's stderr there
        procs = []

        def stderr(name: str) -> Any:
            return open(f"{logs}/{name}.log", "wb") if logs else subprocess.DEVNULL

        try:
            for i, extra in enumerate(groups):
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "dynamoctl", "worker", *wargs, *extra, *common,
                    stderr=stderr(f"worker-{i}")))  # fmt: skip
            await _wait_workers(discovery, processes * per_process)
            fargs = ["--port", "0", "--router-mode", router_mode, *(frontend_args or [])]
            if frontends > 1:
                fargs[1] = str(_free_port())
                fargs += ["--reuse-port", *(["--share-bookings"] if share_bookings else [])]
            for i in range(frontends):
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "dynamoctl", "frontend", *fargs, *common,
                    stderr=stderr(f"frontend-{i}" if i else "frontend")))  # fmt: skip
            url = await _frontend_url(discovery, frontends)
            await _wait_served(url, processes * per_process)
            workers = [psutil.Process(p.pid) for p in procs[:-frontends]]
            fronts = [psutil.Process(p.pid) for p in procs[-frontends:]]
            yield Cluster(url, fronts[0], workers, discovery, fronts)
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.terminate()
            for proc in procs:
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except asyncio.TimeoutError:
                    proc.kill()


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system
