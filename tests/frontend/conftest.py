"""A real deployment for frontend tests: mocker worker processes + a frontend process,
on embedded discovery in a temp dir, everything on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from dynamoctl import wire
from dynamoctl.discovery import Discovery, store_from_url

NS = "ftest"
MODEL = "mock-llama"
BLOCK = 16
BLOCKS = 1024
START_S = 90
"""How long a process may take to register: a Python process importing dynamoctl on a
loaded 2-core machine takes tens of seconds (measured: a frontend with an empty log after
30 s at load average 16). Only a failing start waits this long."""


@dataclass
class Deployment:
    tmp: Path
    frontend_url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def discovery_url(self) -> str:
        return f"embedded://{self.tmp}"

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamoctl", *args, "--namespace", NS,
             "--discovery", self.discovery_url, "--lease-ttl", "2"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def worker(self, *extra: str) -> subprocess.Popen[bytes]:
        return self.spawn(
            "worker", "worker", "--model", MODEL, "--block-size", str(BLOCK),
            "--num-gpu-blocks", str(BLOCKS), *extra,
        )  # fmt: skip

    async def records(self, component: str) -> list[wire.InstanceRecord]:
        async with Discovery(store_from_url(self.discovery_url), lease_ttl=2) as disc:
            found = await disc.list(f"{NS}/instances/{component}/")
        return [wire.decode_json(v, wire.InstanceRecord) for v in found.values()]

    async def wait_for(self, component: str, n: int, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while len(await self.records(component)) < n:
            for proc in self.procs:
                assert proc.poll() is None, f"a process exited: see {self.tmp}/*.log"
            assert time.monotonic() < deadline, f"{component}: fewer than {n} registered"
            await asyncio.sleep(0.1)

    async def start_frontend(self, *extra: str) -> None:
        self.spawn("frontend", "frontend", "--port", "0", *extra)
        await self.wait_for("frontend", 1)
        self.frontend_url = (await self.records("frontend"))[0].address
        # The model shows up once the frontend has seen a worker's card.
        import httpx

        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + START_S
            while time.monotonic() < deadline:
                models = (await http.get(f"{self.frontend_url}/v1/models")).json()["data"]
                if models:
                    return
                await asyncio.sleep(0.1)
        pytest.fail("frontend never listed the model")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


PARSED_MODELS = {
    "mt-hermes": ["--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"],
    "mt-llama": ["--tool-call-parser", "llama3_json", "--reasoning-parser", "qwen3"],
    "mt-plain": [],
}
"""Mocker models whose recipes name a tool-call and a reasoning parser (the mocker writes
calls and thinking in that format), and one with none."""
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
"""A function's arguments, as the tool tests offer it."""


@contextlib.asynccontextmanager
async def parsed_models(
    tmp: Path, models: list[str], *frontend_args: str, worker_args: Sequence[str] = ()
) -> AsyncIterator[Deployment]:
    """One mocker worker per model of :data:`PARSED_MODELS`, one frontend that lists all."""
    import httpx

    dep = Deployment(tmp)
    try:
        for name in models:
            dep.spawn(
                f"worker-{name}", "worker", "--model", name, "--block-size", str(BLOCK),
                "--num-gpu-blocks", str(BLOCKS), "--speedup-ratio", "50", *PARSED_MODELS[name],
                *worker_args,
            )  # fmt: skip
        await dep.wait_for("worker", len(models))
        await dep.start_frontend(*frontend_args)
        async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
            for _ in range(100):  # every model's card seen
                if len((await http.get("/v1/models")).json()["data"]) == len(models):
                    break
                await asyncio.sleep(0.1)
        yield dep
    finally:
        dep.stop()


DeploymentFactory = Callable[..., "asyncio.Future[Deployment]"]


@contextlib.asynccontextmanager
async def two_workers(tmp: Path) -> AsyncIterator[Deployment]:
    """Two mocker workers (one process) behind a kv-routed frontend."""
    dep = Deployment(tmp)
    try:
        dep.worker("--num-workers", "2", "--speedup-ratio", "20")
        await dep.wait_for("worker", 2)
        await dep.start_frontend()
        yield dep
    finally:
        dep.stop()


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    """Two mocker workers (one process) behind a kv-routed frontend, fresh for the test."""
    async with two_workers(tmp_path) as dep:
        yield dep


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_deployment(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    """The same, one for the module: for tests whose requests leave nothing that another
    test reads (4xx answers, hostile input); they run on the module's event loop
    (``@pytest.mark.asyncio(loop_scope="module")``). A start costs seconds on a 2-core
    machine, tens of seconds under load."""
    async with two_workers(tmp_path_factory.mktemp("shared")) as dep:
        yield dep
