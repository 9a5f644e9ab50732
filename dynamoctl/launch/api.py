"""Launchers: start one planned instance on its host and control it as a process group.

The ``local``, ``ssh`` and ``slurm`` launchers share this interface and these semantics:

- An instance runs in a process group of its own (under Slurm: a job step of its own);
  a signal reaches the whole group, so an engine's helper processes stop with it.
- An instance outlives its supervisor by ``supervision.orphan_grace`` seconds at most: the
  keeper (:mod:`dynamoctl.launch.keeper`) wrapped around it stops the group when no
  lifeline (its stdin, a pipe or SSH channel held by the supervisor, or a connection to
  its unix socket) has been attached for that long; under Slurm the job's end ends its
  steps. Meanwhile a new supervisor may :meth:`Launcher.adopt` it.
- What it prints lands in its log file in the run directory on the supervisor's host.
- Its :class:`ProcessRecord` is enough for another process (``dynamoctl down`` after the
  supervisor was killed) to find and stop it again with :meth:`Launcher.reap`, or (a new
  ``dynamoctl up``) to take it back with :meth:`Launcher.adopt`.
- Its secrets (:attr:`InstanceSpec.secrets`) are read right before it starts and reach
  its environment without a command line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Protocol

import msgspec

log = logging.getLogger(__name__)

LOST = 255
"""Exit status of an instance whose end was not seen (its connection lost, or its keeper
killed while adopted), as ssh reports a lost connection."""


class LaunchError(Exception):
    """An instance cannot be started here; the message says what and where."""


PORT_FIELDS = {
    "http": "frontend.port",
    "client": "etcd's client port (2379)",
    "peer": "etcd's peer port (2380)",
    "rendezvous": "workers.rendezvous_port",
}
"""Where each declared port comes from, for the error that says what to change."""


class SecretRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a secret's value is read, on the supervisor's host, right before a launch.

    The plan, ``state.json`` and the dry run carry this reference, never the value; a
    launcher reads it with :meth:`read` and delivers it without a command line (local: the
    process environment; ssh: the keeper's stdin; slurm: ``srun``'s environment)."""

    env: str = ""
    """Name of an environment variable of the supervisor."""
    file: str = ""
    """Path of a file (its content, a trailing newline removed)."""

    def describe(self) -> str:
        """What a dry run shows instead of the value."""
        return f"<from env {self.env}>" if self.env else f"<from file {self.file}>"

    def read(self, name: str) -> str:
        """The value, or :class:`LaunchError` naming ``name`` and where it was looked for."""
        if self.env:
            value = os.environ.get(self.env)
            if value is None:
                raise LaunchError(f"secret {name}: environment variable {self.env} is not set")
            return value
        try:
            return Path(self.file).expanduser().read_text().removesuffix("\n")
        except OSError as exc:
            raise LaunchError(f"secret {name}: cannot read {self.file}: {exc.strerror}") from exc


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One process of the plan: what runs, where, with what."""

    name: str
    """Unique in the deployment: ``frontend-0``, ``agg-1``, ``router-0``, ``etcd-0``."""
    pool: str
    """What ``scale`` and ``drain POOL`` address: ``agg``, ``prefill``, ``decode``,
    ``frontend``, ``router``, ``planner``, ``etcd``."""
    component: str
    """``worker``, ``frontend``, ``router``, ``planner`` or ``etcd``."""
    host: str
    """Where it runs: ``localhost``, an SSH host, or a Slurm node name."""
    address: str = ""
    """IPv4 address it listens on and advertises, on ``host`` (empty: none of its own)."""
    ports: dict[str, int] = {}
    """Fixed TCP ports it listens on, by purpose (``http``, ``client``, ``peer``,
    ``nixl_side_channel[_dpN]``, ``bootstrap``):
    preflight checks they are free on ``host``. Ports chosen at run time are not here."""
    argv: list[str]
    """The exact command, run on ``host``."""
    env: dict[str, str] = {}
    """Environment added to the host's (``CUDA_VISIBLE_DEVICES`` among them)."""
    gpus: list[int] = []
    """GPU indices on ``host`` given to this instance."""
    secrets: dict[str, SecretRef] = {}
    """Environment variables whose values are secrets (tokens, keys), by reference: never
    on a command line, in ``state.json`` or in a dry run."""
    paths: dict[str, str] = {}
    """Directories it writes on ``host``, by the recipe field naming them
    (``kv_offload.disk_path``): preflight checks they exist and are writable there."""
    gang: str = ""
    """The multi-node replica this process is a member of (its leader's name, ``agg-0``);
    empty for a replica on one node."""
    rank: int = 0
    """Node rank in its gang: 0 is the leader (it registers and serves), 1.. followers."""
    nnodes: int = 1
    """Members of its gang (1: not a gang)."""
    mpi_nodes: list[str] = []
    """The nodes one launch of it spans, ``host`` first: a TensorRT-LLM gang is one MPI
    world, one ``srun --mpi=pmix`` step over all of them (Slurm only); empty otherwise."""
    mpi_tasks_per_node: int = 0
    """MPI ranks on each of ``mpi_nodes`` (the node's GPUs)."""


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How to find a launched instance again, from any process on the supervisor's host."""

    launcher: str
    """``local``, ``ssh`` or ``slurm``."""
    host: str
    """Host the process group lives on."""
    pid: int
    """Pid of the group leader (the keeper; under Slurm, the local ``srun``)."""
    pgid: int
    """Process group on ``host`` (equal to ``pid`` for the keeper)."""
    step: str | None = None
    """Slurm ``JOBID.STEPID`` of the instance's job step."""
    socket: str = ""
    """The keeper's lifeline socket on ``host`` (empty: it cannot be adopted)."""


def read_secrets(spec: InstanceSpec) -> dict[str, str]:
    """``spec``'s secrets by variable name, read now (a launcher calls it right before it
    starts ``spec``); :class:`LaunchError` names one that cannot be read."""
    return {name: ref.read(name) for name, ref in spec.secrets.items()}


def port_in_use(spec: InstanceSpec, purpose: str, port: int, why: str) -> LaunchError:
    source = PORT_FIELDS.get(purpose, f"the {purpose} port the plan assigns")
    return LaunchError(
        f"{spec.name}: port {port} ({purpose}) on {spec.host} is already in use ({why}); "
        f"stop what holds it or change {source}"
    )


def path_unusable(spec: InstanceSpec, why: dict[str, str]) -> LaunchError | None:
    """The error for the first of ``spec.paths`` that ``why`` (path -> reason, from
    :func:`dynamoctl.launch.hostcheck.unusable_paths` on its host) says is unusable."""
    for field, path in spec.paths.items():
        if path in why:
            return LaunchError(
                f"{spec.name}: {field} {path} on {spec.host} {why[path]}; create it there "
                "(writable by the deployment's user) or change the recipe"
            )
    return None


class Launched(Protocol):
    """A started instance."""

    record: ProcessRecord

    @property
    def returncode(self) -> int | None:
        """Exit status once it ended (negative: killed by that signal), else None."""

    async def wait(self) -> int:
        """Wait for the end; return :attr:`returncode`."""

    async def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group; no error if it has already ended."""


class Launcher(Protocol):
    """Starts instances on one kind of target."""

    kind: str

    async def preflight(self, instances: list[InstanceSpec]) -> None:
        """Check, before anything starts, that every instance can start (hosts reachable,
        interpreter present, ports free); raise :class:`LaunchError` naming the first
        problem."""

    def describe(self, spec: InstanceSpec) -> list[str]:
        """The command line that starts ``spec``, as a dry run prints it."""

    async def start(self, spec: InstanceSpec, log: Path) -> Launched:
        """Start ``spec``; its output is appended to ``log``."""

    async def reap(self, record: ProcessRecord, grace: float) -> bool:
        """Stop what is left of a recorded instance (SIGTERM, ``grace``, SIGKILL); True if
        something was still running."""

    async def adopt(self, record: ProcessRecord, log: Path) -> Launched | None:
        """Attach a lifeline to a recorded instance a dead supervisor left running (output
        from now on appended to ``log``); None when its keeper is gone or cannot be
        adopted (then :meth:`reap` what is left)."""

    async def close(self) -> None:
        """Release connections; instances still running are stopped by their keepers once
        their orphan grace is over."""


KILL_WAIT_S = 10.0
"""Seconds a SIGKILLed instance's end may take to be seen before it is given up as
:data:`LOST` (a stop never waits without a bound: ``down`` has a deadline)."""


async def ended_within(proc: Launched, seconds: float) -> int | None:
    """``proc``'s exit status if it ends within ``seconds``, else None (it is not waited
    for any longer)."""
    ended = asyncio.ensure_future(proc.wait())
    try:
        done, _ = await asyncio.wait({ended}, timeout=seconds)
        return ended.result() if done else None
    finally:
        ended.cancel()


async def kill(proc: Launched) -> int:
    """SIGKILL the group, then at most :data:`KILL_WAIT_S` for the end to be seen; the exit
    status, or :data:`LOST`."""
    await proc.signal(signal.SIGKILL)
    status = await ended_within(proc, KILL_WAIT_S)
    if status is None:
        log.error(
            "pid %d on %s: no end seen %g s after SIGKILL; given up as lost",
            proc.record.pid, proc.record.host, KILL_WAIT_S,
        )  # fmt: skip
        return LOST
    return status


async def stop(proc: Launched, grace: float) -> int:
    """terminate → deadline → kill: SIGTERM to the group, ``grace`` seconds, then SIGKILL
    (:func:`kill`); the exit status, never a wait without a bound."""
    if proc.returncode is not None:
        return proc.returncode
    await proc.signal(signal.SIGTERM)
    status = await ended_within(proc, grace)
    return status if status is not None else await kill(proc)
