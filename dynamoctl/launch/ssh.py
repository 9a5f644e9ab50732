"""The ssh launcher: instances run on SSH-reachable hosts, under a keeper, over asyncssh.

Each instance is one SSH session channel (no PTY) whose command ``exec``s the keeper: it
replaces the login shell, so it leads the session sshd made for it (pid = pgid). The
first line written to the channel's stdin is the instance's secrets (``--env-stdin``);
the channel, held open here, is then its first lifeline. The keeper owns the command's
output (``--relay-output``: stdout and stderr merged) and relays it over the channel into
the local log file, so a closed channel never reaches the command as EPIPE. When the
channel is lost without an exit status (connection dropped, sshd restarted) and the
keeper has a lifeline socket, the instance is reattached over a new connection (``keeper
attach SOCKET``) within ``orphan_grace``, without the supervisor noticing; a new
supervisor adopts it the same way (docs/architecture.md, "Keepers and lifelines").

Choices and known gaps:

- Host keys are checked against ``known_hosts`` (default ``~/.ssh/known_hosts``, as ssh
  does); an unknown host is refused with a hint. ``known_hosts=None`` turns that off.
- One connection per host, opened lazily and shared; when sshd refuses another channel on
  it (``MaxSessions``, default 10) a further connection is opened.
- sshd notices a vanished supervisor *host* only by its keepalives (TCPKeepAlive,
  ClientAliveInterval); an exited or killed supervisor is noticed at once.
- ``--setsid`` fails (EPERM) in a session leader, which an exec'd command under sshd is,
  so it is not passed. The keeper's own lines (a command that cannot start, a lifeline
  coming or going) go where the command's output goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shlex
import socket
from collections import deque
from pathlib import Path
from typing import IO, Any

import asyncssh

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
from dynamoctl.launch.gpus import FIX_GPU_COUNT, check_gpus
from dynamoctl.launch.lifeline import NO_KEEPER
from dynamoctl.launch.local import keeper_argv, lifeline_options
from dynamoctl.launch.ssh_tree import stage_ahead
from dynamoctl.launch.weights import Ahead, ahead
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SshTarget

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
__all__ = ["LOST", "SshLauncher", "SshProcess"]  # LOST: a lost connection's return code
_HEADER_TIMEOUT = 30.0
_REATTACH_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds between attempts to reattach a lost instance (the last one repeats)."""
# Runs on the host: the local launcher's reap, exit 0 if something was running, 3 if not.
_REAP = """
import asyncio, sys
from dynamoctl.launch.local import reap_local_group
try:
    found = asyncio.run(reap_local_group(int(sys.argv[1]), float(sys.argv[2])))
except ProcessLookupError:
    found = False
sys.exit(0 if found else 3)
"""

Process = asyncssh.SSHClientProcess[bytes]


class SshProcess:
    """A keeper on a remote host; its SSH channel carries its output and exit status."""

    def __init__(
        self, launcher: SshLauncher, proc: Process, record: ProcessRecord, out: IO[bytes]
    ) -> None:
        self.record = record
        self._launcher = launcher
        self._proc = proc
        self._ended = asyncio.create_task(self._pump(out))

    async def _pump(self, out: IO[bytes]) -> int:
        """Copy output until an exit status comes; a channel lost without one is
        reattached to the same keeper if it can be, else the end is :data:`LOST`."""
        with out:
            while True:
                with contextlib.suppress(asyncssh.Error, OSError):  # connection lost
                    while chunk := await self._proc.stdout.read(65536):
                        out.write(chunk)
                await self._proc.wait_closed()
                if self._proc.returncode is not None:
                    return self._proc.returncode
                again = await self._launcher.reattach(self.record, out)
                if again is None:
                    return LOST
                self._proc = again

    @property
    def returncode(self) -> int | None:
        """The channel's exit status: the keeper's (128 + N when the command died of signal
        N), -N when the keeper itself was killed by signal N, :data:`LOST` when lost."""
        return self._ended.result() if self._ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def signal(self, sig: int) -> None:
        if self.returncode is None:
            command = f"kill -{int(sig)} -{self.record.pgid}"  # sh, bash, zsh: no "--"
            await self._launcher._run(self.record.host, command, timeout=30)


class SshLauncher:
    """Runs instances on SSH hosts, each in a process group of its own there."""

    kind = "ssh"

    def __init__(
        self,
        *,
        user: str | None = None,
        port: int = 22,
        key: str | Path | None = None,
        python: str = "python3",
        workdir: str | None = None,
        known_hosts: str | Path | None = DEFAULT_KNOWN_HOSTS,
        connect_timeout: float = 10.0,
        orphan_grace: float = 0.0,
        stage_ahead: Ahead | None = None,
    ) -> None:
        self.stage_ahead = stage_ahead
        """The model staged onto the workers' hosts, coordinated, before they start
        (recipe ``model.cache.stage_ahead``; :mod:`~dynamoctl.launch.ssh_tree`)."""
        self.user = user
        self.port = port
        self.key = Path(key).expanduser() if key is not None else None
        self.python = python
        self.workdir = workdir
        # Commands start in the remote home: "~/x" is "x" there, and quoting keeps it so.
        self._cwd = "" if workdir in (None, "~") else workdir.removeprefix("~/")
        self.known_hosts = Path(known_hosts).expanduser() if known_hosts is not None else None
        self.connect_timeout = connect_timeout
        self.orphan_grace = orphan_grace
        """Seconds an instance outlives its channel, waiting to be reattached or adopted."""
        self._closing = False
        self._conns: dict[str, list[asyncssh.SSHClientConnection]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def from_target(
        cls,
        target: SshTarget,
        *,
        connect_timeout: float = 10.0,
        orphan_grace: float = 0.0,
        stage_ahead: Ahead | None = None,
    ) -> SshLauncher:
        return cls(
            user=target.user,
            port=target.port,
            key=target.key,
            python=target.python,
            workdir=target.workdir,
            known_hosts=target.known_hosts or DEFAULT_KNOWN_HOSTS,
            connect_timeout=connect_timeout,
            orphan_grace=orphan_grace,
            stage_ahead=stage_ahead,
        )

    def remote_command(self, spec: InstanceSpec) -> str:
        """The shell command run on ``spec.host`` (see the module docstring for its form)."""
        env = ["env", *(f"{k}={v}" for k, v in spec.env.items())] if spec.env else []
        options = ["--header", "--relay-output", "--env-stdin"]
        options += lifeline_options(spec, self.orphan_grace)
        command = f"exec {shlex.join([*env, *keeper_argv(spec, self.python, options)])}"
        if self._cwd:
            command = f"cd {shlex.quote(self._cwd)} && {command}"
        return command

    def describe(self, spec: InstanceSpec) -> list[str]:
        argv = ["ssh", "-p", str(self.port)]
        if self.key is not None:
            argv += ["-i", str(self.key)]
        if self.known_hosts is None:
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        elif self.known_hosts != Path(DEFAULT_KNOWN_HOSTS).expanduser():
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        dest = f"{self.user}@{spec.host}" if self.user else spec.host
        return [*argv, dest, self.remote_command(spec)]

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        hosts = list(dict.fromkeys(spec.host for spec in instances))
        ports = {
            h: sorted({p for s in instances if s.host == h for p in s.ports.values()})
            for h in hosts
        }
        paths = {
            h: sorted({p for s in instances if s.host == h for p in s.paths.values()})
            for h in hosts
        }
        results = await asyncio.gather(
            *(self._check_host(h, ports[h], paths[h]) for h in hosts), return_exceptions=True
        )
        busy: dict[str, dict[str, str]] = {}
        unusable: dict[str, dict[str, str]] = {}
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, BaseException):
                raise result
            busy[host], gpus, unusable[host] = result
            check_gpus(host, gpus, instances, "target.gpus_per_host", FIX_GPU_COUNT)
        for spec in instances:
            for purpose, port in spec.ports.items():
                if str(port) in busy[spec.host]:
                    raise port_in_use(spec, purpose, port, busy[spec.host][str(port)])
            error = path_unusable(spec, unusable[spec.host])
            if error is not None:
                raise error
        if self.stage_ahead is not None:
            await stage_ahead(self.command, instances, self.stage_ahead, self.python)

    async def _check_host(
        self, host: str, ports: list[int], paths: list[str]
    ) -> tuple[dict[str, str], int, dict[str, str]]:
        args = [self.python, "-m", "dynamoctl.launch.hostcheck", self._cwd, json.dumps(ports),
                json.dumps(paths)]  # fmt: skip
        code, output = await self._run(host, "exec " + shlex.join(args), self.connect_timeout + 30)
        for result in hostcheck.parse(output):
            if result["workdir"]:
                raise LaunchError(f"ssh {host}: workdir {self.workdir}: {result['workdir']}")
            return dict(result["busy"]), int(result["gpus"]), dict(result.get("paths", {}))
        raise LaunchError(
            f"ssh {host}: {self.python} cannot import dynamoctl ({_status(code, output)}); "
            "set the target's python to an interpreter that has dynamoctl installed"
        )

    async def start(self, spec: InstanceSpec, log: Path) -> SshProcess:
        secrets = read_secrets(spec)  # over the channel to the keeper, never on its argv
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab", buffering=0)  # closed by the pump
        proc: Process | None = None
        who = f"{spec.name}: cannot start {self.python} -m dynamoctl.launch.keeper on {spec.host}"
        try:
            proc = await self._open(spec.host, self.remote_command(spec))
            proc.stdin.write(json.dumps(secrets).encode() + b"\n")
            header = await asyncio.wait_for(_read_header(proc, out, who), _HEADER_TIMEOUT)
            if header["pid"] != header["pgid"]:  # a login shell that did not exec the keeper
                raise LaunchError(f"{who}: the keeper does not lead its process group {header}")
        except BaseException as exc:
            out.close()
            if proc is not None:
                proc.close()
            if isinstance(exc, asyncio.TimeoutError):
                raise LaunchError(f"{who}: no keeper header in {_HEADER_TIMEOUT:g} s") from None
            raise
        record = ProcessRecord(
            launcher="ssh",
            host=spec.host,
            pid=header["pid"],
            pgid=header["pgid"],
            socket=header.get("socket", ""),
        )
        return SshProcess(self, proc, record, out)

    async def adopt(self, record: ProcessRecord, log: Path) -> SshProcess | None:
        if record.launcher != self.kind or not record.socket:
            return None
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab", buffering=0)  # closed by the pump
        try:
            proc = await self._attach(record, out)
        except LaunchError as exc:
            log_line = f"[supervisor] cannot adopt pid {record.pid} on {record.host}: {exc}\n"
            out.write(log_line.encode())
            proc = None
        if proc is None:
            out.close()
            return None
        return SshProcess(self, proc, record, out)

    async def reattach(self, record: ProcessRecord, out: IO[bytes]) -> Process | None:
        """A new channel to the keeper of ``record`` after its channel was lost, tried for
        ``orphan_grace`` seconds; None when it is gone, cannot be reached or we close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.orphan_grace
        for attempt in itertools.count():
            if self._closing or not record.socket or loop.time() >= deadline:
                return None
            try:
                return await self._attach(record, out)
            except LaunchError:
                pause = _REATTACH_DELAYS[min(attempt, len(_REATTACH_DELAYS) - 1)]
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        return None  # pragma: no cover - the loop above never ends by itself

    async def _attach(self, record: ProcessRecord, out: IO[bytes]) -> Process | None:
        """A channel running ``keeper attach`` to ``record``'s socket, past its header; None
        when no keeper (or another one) answers there; :class:`LaunchError` when the host
        cannot be reached."""
        args = [self.python, "-m", "dynamoctl.launch.keeper", "attach", record.socket]
        proc = await self._open(record.host, "exec " + shlex.join(args))
        who = f"cannot attach to the keeper of pid {record.pid} on {record.host}"
        try:
            header = await asyncio.wait_for(_read_header(proc, out, who), _HEADER_TIMEOUT)
        except LaunchError:
            proc.close()
            if proc.returncode == NO_KEEPER:
                return None
            raise
        except asyncio.TimeoutError:
            proc.close()
            raise LaunchError(f"{who}: no header in {_HEADER_TIMEOUT:g} s") from None
        if header["pid"] != record.pid:  # a new keeper with a recycled pid
            proc.close()
            return None
        return proc

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        args = [self.python, "-c", _REAP, str(record.pgid), str(grace)]
        code, output = await self._run(record.host, "exec " + shlex.join(args), grace + 30)
        if code not in (0, 3):
            raise LaunchError(
                f"ssh {record.host}: cannot reap group {record.pgid} ({_status(code, output)})"
            )
        return code == 0

    async def close(self) -> None:
        self._closing = True
        conns = [c for host_conns in self._conns.values() for c in host_conns]
        self._conns.clear()
        for conn in conns:
            conn.close()
        await asyncio.gather(*(conn.wait_closed() for conn in conns))

    async def command(self, host: str, argv: list[str]) -> Process:
        """``argv`` run on ``host`` in the workdir, output and errors merged, its input
        open (a staging step: dynamoctl.launch.stage)."""
        command = f"exec {shlex.join(argv)}"
        if self._cwd:
            command = f"cd {shlex.quote(self._cwd)} && {command}"
        return await self._open(host, command)

    async def _run(self, host: str, command: str, timeout: float) -> tuple[int, str]:
        """Run a short command on ``host``: its exit status and output."""
        proc = await self._open(host, command)
        try:
            done = await proc.wait(timeout=timeout)
        except asyncssh.TimeoutError:
            proc.close()
            raise LaunchError(f"ssh {host}: {command[:40]!r}... ran over {timeout:g} s") from None
        output = done.stdout or b""
        text = output if isinstance(output, str) else output.decode(errors="replace")
        return (LOST if done.returncode is None else done.returncode), text

    async def _open(self, host: str, command: str) -> Process:
        """A session channel running ``command``, on a connection that still has room."""
        async with self._locks.setdefault(host, asyncio.Lock()):
            conns = self._conns.setdefault(host, [])
            conns[:] = [c for c in conns if not c.is_closed()]
            for conn in reversed(conns):  # a full one (MaxSessions) refuses, a lost one fails
                with contextlib.suppress(asyncssh.Error, OSError, asyncio.TimeoutError):
                    return await self._process(conn, command)
            conn = await self._connect(host)
            conns.append(conn)
            try:
                return await self._process(conn, command)
            except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
                raise LaunchError(f"ssh {host}: no session ({exc!r})") from exc

    async def _process(self, conn: asyncssh.SSHClientConnection, command: str) -> Process:
        opening = conn.create_process(command, encoding=None, stderr=asyncssh.STDOUT)
        return await asyncio.wait_for(opening, self.connect_timeout)  # no PTY: none asked

    async def _connect(self, host: str) -> asyncssh.SSHClientConnection:
        where = f"ssh {host}:{self.port}"
        options: dict[str, Any] = {"port": self.port, "keepalive_interval": 30}
        if self.user:
            options["username"] = self.user
        if self.key is not None:
            if not self.key.is_file():
                raise LaunchError(f"{where}: key {self.key} does not exist")
            options["client_keys"] = [str(self.key)]
        known = self.known_hosts  # an absent file trusts no host, as ssh
        options["known_hosts"] = None if known is None else (str(known) if known.is_file() else b"")
        try:
            return await asyncio.wait_for(asyncssh.connect(host, **options), self.connect_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            reason = f"timed out after {self.connect_timeout:g} s"
        except asyncssh.PermissionDenied:
            reason = f"permission denied (publickey) for user {self.user or '(default)'}"
            reason += f" with key {self.key}" if self.key else ""
        except asyncssh.HostKeyNotVerifiable as exc:
            reason = (
                f"host key not verifiable ({exc.reason}); check it, then add it to "
                f"{self.known_hosts}: ssh-keyscan -p {self.port} {host} >> {self.known_hosts}"
            )
        except asyncssh.Error as exc:
            reason = exc.reason
        except socket.gaierror as exc:
            reason = f"cannot resolve the name ({exc.strerror})"
        except OSError as exc:  # asyncio words it "Connect call failed": say why instead
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise LaunchError(f"{where}: {reason}")


async def _read_header(proc: Process, out: IO[bytes], who: str) -> dict[str, Any]:
    """The keeper's JSON header; lines before it (a chatty shell rc file) go to the log."""
    tail: deque[bytes] = deque(maxlen=3)
    while line := await proc.stdout.readline():
        if line.startswith(b'{"pid"'):
            header: dict[str, Any] = json.loads(line)
            return header
        out.write(line)
        tail.append(line)
    await proc.wait_closed()
    raise LaunchError(f"{who} ({_status(proc.returncode, b''.join(tail).decode())})")


def _status(code: int | None, output: str) -> str:
    last = output.strip().splitlines()[-1:] or ["no output"]
    return f"exit {LOST if code is None else code}: {last[0]}"


def from_recipe(recipe: Recipe) -> SshLauncher:
    assert isinstance(recipe.target, SshTarget)
    return SshLauncher.from_target(
        recipe.target, orphan_grace=recipe.supervision.orphan_grace, stage_ahead=ahead(recipe)
    )
