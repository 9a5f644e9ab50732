"""The local launcher: instances are children of the supervisor on this machine, each
under a keeper whose stdin pipe is its first lifeline; a later supervisor adopts them
through the keeper's unix socket (docs/architecture.md, "Keepers and lifelines")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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

log = logging.getLogger(__name__)


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
    """A keeper in its own session on this machine; its stdin pipe is the lifeline.

    Its end is read from the kernel as well as from the event loop: a pidfd (Linux) says
    at once that the keeper has exited, and if the loop has not reported that exit
    :data:`MISSED_EXIT_S` later (uvloop reports none for a child whose status another
    ``waitpid`` took), the status is read with ``waitid``. A missed exit must not leave
    an instance STARTING forever and hang the teardown that waits for it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.record = ProcessRecord(launcher="local", host="localhost", pid=proc.pid, pgid=proc.pid)
        self._status: int | None = None
        self._ended: asyncio.Task[int] | None = None

    @property
    def returncode(self) -> int | None:
        return self._status if self._status is not None else self._proc.returncode

    async def wait(self) -> int:
        if self._ended is None:  # one follower of the end, however many wait
            self._ended = asyncio.create_task(self._follow(), name=f"end-{self.record.pid}")
        return await asyncio.shield(self._ended)

    async def _follow(self) -> int:
        by_loop = asyncio.ensure_future(self._proc.wait())
        by_kernel = asyncio.ensure_future(_exited(self._proc.pid))
        try:
            await asyncio.wait({by_loop, by_kernel}, return_when=asyncio.FIRST_COMPLETED)
            if not by_loop.done():  # the kernel says it ended: the loop should say so soon
                await asyncio.wait({by_loop}, timeout=MISSED_EXIT_S)
            if by_loop.done():
                self._status = by_loop.result()
            else:
                self._status = _reap(self._proc.pid)
                log.warning(
                    "pid %d: its exit (status %d) was not reported by the event loop; "
                    "read from the kernel",
                    self._proc.pid, self._status,
                )  # fmt: skip
            return self._status
        finally:
            by_loop.cancel()
            by_kernel.cancel()

    async def signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.record.pgid, sig)


MISSED_EXIT_S = 1.0
"""Seconds the event loop gets to report an exit the kernel has shown, before the status
is read from the kernel instead."""
EXIT_POLL_S = 0.5
"""Seconds between looks at a child's state where no pidfd can be had."""


async def _exited(pid: int) -> None:
    """Return once child ``pid`` has exited (a zombie, or reaped already), without reaping it."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or gone already
        pidfd = -1
    if pidfd >= 0:
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def turned_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(pidfd, turned_readable)
        try:
            await readable  # a pidfd turns readable when its process exits
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return
    # No pidfd: nothing to await but the kernel's word, asked now and then.
    while not _has_exited(pid):  # noqa: ASYNC110
        await asyncio.sleep(EXIT_POLL_S)


def _has_exited(pid: int) -> bool:
    try:  # WNOWAIT: look, leave the status for the loop's own waitpid
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already (by whoever)


def _reap(pid: int) -> int:
    """The exit status of child ``pid`` (negative: killed by that signal), reaping it;
    :data:`LOST` when another ``waitpid`` took it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        return LOST
    if info is None:  # not ended after all (cannot happen once the pidfd said so)
        return LOST
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


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
