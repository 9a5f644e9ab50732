"""The local launcher: instances are children of the supervisor on this machine, each
under a keeper whose stdin pipe is its first lifeline; a later supervisor adopts them
through the keeper's unix socket (docs/architecture.md, "Keepers and lifelines")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import psutil

from dynamoctl.launch import hostcheck
from dynamoctl.launch.api import (
    LOST,
    InstanceSpec,
    LaunchError,
    ProcessRecord,
    path_unusable,
    port_in_use,
    read_secrets,
)
from dynamoctl.launch.gpus import FIX_GPU_COUNT, check_gpus, count_local_gpus
from dynamoctl.launch.lifeline import socket_path
from dynamoctl.wire.keeper import KeeperExit, KeeperHeader, read_frame

if TYPE_CHECKING:  # the recipe's models are not needed where a keeper is reaped
    from dynamoctl.recipe.models import Recipe


def keeper_argv(
    spec: InstanceSpec, python: str = sys.executable, options: Sequence[str] = ()
) -> list[str]:
    """``spec.argv`` wrapped in the keeper, with its ``options``."""
    return [python, "-m", "dynamoctl.launch.keeper", *options, "--", *spec.argv]


def lifeline_options(spec: InstanceSpec, orphan_grace: float) -> list[str]:
    """Keeper options that let ``spec`` outlive its supervisor by ``orphan_grace`` seconds
    and be adopted meanwhile (none for 0: stopped as soon as its supervisor is gone)."""
    if orphan_grace <= 0:
        return []
    return ["--orphan-grace", f"{orphan_grace:g}", "--socket", spec.name]


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


class AdoptedProcess:
    """A keeper another supervisor started, followed through a lifeline on its socket; it
    writes its output to its log itself."""

    def __init__(
        self, record: ProcessRecord, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.record = record
        self._writer = writer
        self._ended = asyncio.create_task(self._follow(reader))

    async def _follow(self, reader: asyncio.StreamReader) -> int:
        try:
            while (message := await read_frame(reader)) is not None:
                if isinstance(message, KeeperExit):
                    return message.status
            return LOST  # the keeper itself was killed
        finally:
            self._writer.close()

    @property
    def returncode(self) -> int | None:
        return self._ended.result() if self._ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.record.pgid, sig)


async def attach_local(record: ProcessRecord) -> AdoptedProcess | None:
    """A lifeline to the keeper ``record`` names, if that keeper still runs."""
    if not record.socket:
        return None
    try:
        reader, writer = await asyncio.open_unix_connection(record.socket)
    except OSError:
        return None
    try:
        header = await asyncio.wait_for(read_frame(reader), 10)
    except (OSError, asyncio.TimeoutError, msgspec.DecodeError):
        header = None
    if not isinstance(header, KeeperHeader) or header.pid != record.pid:
        writer.close()
        return None
    return AdoptedProcess(record, reader, writer)


class LocalLauncher:
    """Runs every instance on this machine, each in a process group of its own."""

    kind = "local"

    def __init__(self, orphan_grace: float = 0.0) -> None:
        self.orphan_grace = orphan_grace
        """Seconds an instance outlives this supervisor, waiting to be adopted."""

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        if any(spec.gpus for spec in instances):
            check_gpus("localhost", count_local_gpus(), instances, "target.gpus", FIX_GPU_COUNT)
        for spec in instances:
            for purpose, port in spec.ports.items():
                _check_port_free(spec, purpose, port)
            error = path_unusable(spec, hostcheck.unusable_paths(list(spec.paths.values())))
            if error is not None:
                raise error

    def describe(self, spec: InstanceSpec) -> list[str]:
        return keeper_argv(spec, options=lifeline_options(spec, self.orphan_grace))

    async def start(self, spec: InstanceSpec, log: Path) -> LocalProcess:
        secrets = read_secrets(spec)  # in the keeper's environment, never its argv
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # noqa: ASYNC230 - a local file, opened once
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.describe(spec),
                    stdin=asyncio.subprocess.PIPE,  # held open by us: EOF = supervisor gone
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env={**os.environ, **spec.env, **secrets},
                    start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}") from exc
        launched = LocalProcess(proc)
        if self.orphan_grace > 0:
            where = str(socket_path(spec.name, proc.pid))  # the keeper's own choice, here
            launched.record = msgspec.structs.replace(launched.record, socket=where)
        return launched

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        return await reap_local_group(record.pgid, grace)

    async def adopt(self, record: ProcessRecord, log: Path) -> AdoptedProcess | None:
        return await attach_local(record)

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


def from_recipe(recipe: Recipe) -> LocalLauncher:
    return LocalLauncher(orphan_grace=recipe.supervision.orphan_grace)
