"""The local launcher: instances are children of the supervisor on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import psutil

from dynamoctl.launch.api import InstanceSpec, LaunchError, ProcessRecord, port_in_use
from dynamoctl.launch.gpus import FIX_GPU_COUNT, check_gpus, count_local_gpus


def keeper_argv(spec: InstanceSpec, python: str = sys.executable, **flags: bool) -> list[str]:
    """``spec.argv`` wrapped in the keeper, with its ``--flag`` switches."""
    options = [f"--{name.replace('_', '-')}" for name, on in flags.items() if on]
    return [python, "-m", "dynamoctl.launch.keeper", *options, "--", *spec.argv]


class LocalProcess:
    """A keeper in its own session on this machine; its stdin pipe is the lifeline."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.record = ProcessRecord(launcher="local", host="localhost", pid=proc.pid, pgid=proc.pid)

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    async def signal(self, sig: int) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.record.pgid, sig)


class LocalLauncher:
    """Runs every instance on this machine, each in a process group of its own."""

    kind = "local"

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        if any(spec.gpus for spec in instances):
            check_gpus("localhost", count_local_gpus(), instances, "target.gpus", FIX_GPU_COUNT)
        for spec in instances:
            for purpose, port in spec.ports.items():
                _check_port_free(spec, purpose, port)

    def describe(self, spec: InstanceSpec) -> list[str]:
        return keeper_argv(spec)

    async def start(self, spec: InstanceSpec, log: Path) -> LocalProcess:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # noqa: ASYNC230 - a local file, opened once
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.describe(spec),
                    stdin=asyncio.subprocess.PIPE,  # held open by us: EOF = supervisor gone
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env={**os.environ, **spec.env},
                    start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}") from exc
        return LocalProcess(proc)

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        return await reap_local_group(record.pgid, grace)

    async def close(self) -> None:
        """Nothing held: children's stdin pipes close with this process."""


def _is_keeper(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "dynamoctl.launch.keeper" in " ".join(
            proc.cmdline()
        )
    except psutil.Error:
        return False


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (OSError, psutil.Error):
            continue
    return False


async def reap_local_group(pgid: int, grace: float) -> bool:
    """Stop the group a keeper led, if its leader is still that keeper (pids get reused)."""
    if not _is_keeper(pgid):
        return False
    os.killpg(pgid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    # Another process's group: nothing to await but its disappearance.
    while loop.time() < deadline and _group_alive(pgid):  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return True


def _check_port_free(spec: InstanceSpec, purpose: str, port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((spec.address or "127.0.0.1", port))
        except OSError as exc:
            raise port_in_use(spec, purpose, port, exc.strerror or str(exc)) from exc


def from_recipe(_recipe: object) -> LocalLauncher:
    return LocalLauncher()
