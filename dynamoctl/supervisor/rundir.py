"""The run directory of a deployment: its lock, state file and logs.

``$DYNAMOCTL_HOME/runs/NAME`` (default ``$XDG_STATE_HOME/dynamoctl`` or
``~/.local/state/dynamoctl``) holds

- ``lock``: held (``flock``) by the running supervisor, so a second ``up`` of the same
  deployment is refused, and any command can tell whether a supervisor is alive;
- ``state.json``: the plan, each instance's process record and state, and the control
  endpoint with its token (mode 0600: whoever can read it may control the deployment);
- ``slurm-job``: the id of the job ``dynamoctl up`` submitted from a login node, written
  before the job starts (so a queued deployment can be found, and cancelled);
- ``logs/INSTANCE.log``: each instance's output, appended across restarts;
  ``supervisor.log``: the supervisor's own log (foreground, detached or in a Slurm job);
- ``keys/``: the deployment's key material (:mod:`dynamoctl.supervisor.credentials`).

Everything in it is private to its user: directories 0700, files 0600 (:meth:`RunDir.create`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

import msgspec

from dynamoctl.launch.api import ProcessRecord
from dynamoctl.plan.placed import Plan
from dynamoctl.wire.states import Phase

JOB_FILE = "slurm-job"


class RunState(msgspec.Struct, kw_only=True):
    """``state.json``: what another process needs to reach or clean up a deployment."""

    name: str
    recipe: str
    """Absolute path of the recipe file."""
    supervisor_pid: int
    phase: Phase
    """The phase the supervisor last recorded (its value: ``serving``)."""
    control: str = ""
    """Base URL of the control endpoint."""
    token: str = ""
    slurm_job: str = ""
    """The Slurm job the supervisor runs in (``$SLURM_JOB_ID``) under a slurm target."""
    error: str = ""
    """Why ``up`` failed, when ``phase`` is ``failed``."""
    plan: Plan | None = None
    """The deployment as it stands: the planned instances and those ``scale`` added."""
    records: dict[str, ProcessRecord] = {}
    """Launched process of each instance, by instance name."""


def home() -> Path:
    if "DYNAMOCTL_HOME" in os.environ:
        return Path(os.environ["DYNAMOCTL_HOME"])
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "dynamoctl"


class RunDir:
    def __init__(self, name: str, root: Path | None = None) -> None:
        self.name = name
        self.path = (root or home()) / "runs" / name
        self.logs = self.path / "logs"
        self.state_file = self.path / "state.json"
        self._lock: IO[str] | None = None

    def log_of(self, instance: str) -> Path:
        return self.logs / f"{instance}.log"

    def create(self) -> None:
        """Make the run directory private to its user (docs/security.md): this process's
        umask becomes 077, so what it creates later (logs, state, keys, an embedded
        discovery file) and what its local instances create is owner-only from the start;
        what an earlier version left readable is made private too."""
        os.umask(0o077)
        self.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory, _, files in os.walk(self.path):
            with contextlib.suppress(OSError):  # gone meanwhile: nothing to protect
                os.chmod(directory, 0o700)
            for name in files:
                path = os.path.join(directory, name)
                with contextlib.suppress(OSError):
                    if not os.path.islink(path):
                        os.chmod(path, 0o600)

    def lock(self) -> bool:
        """Take the deployment's lock for this process's lifetime; False if held elsewhere."""
        self.create()
        handle = open(self.path / "lock", "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._lock = handle
        return True

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def is_locked(self) -> bool:
        """Whether a live supervisor holds the lock (without taking it)."""
        if not (self.path / "lock").exists():
            return False
        with open(self.path / "lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False

    def known(self) -> bool:
        """Whether a deployment ever started here, or was submitted and is still queued."""
        return self.state_file.exists() or (self.path / JOB_FILE).exists()

    def slurm_job(self, state: RunState | None) -> str | None:
        """The Slurm job of this deployment: the one submitted from a login node, else the
        one its supervisor runs in (``sbatch slurm/launch.sh``)."""
        try:
            return (self.path / JOB_FILE).read_text().strip() or None
        except FileNotFoundError:
            return state.slurm_job if state is not None and state.slurm_job else None

    def read_state(self) -> RunState | None:
        try:
            return msgspec.json.decode(self.state_file.read_bytes(), type=RunState)
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def write_state(self, state: RunState) -> None:
        _write_private(self.state_file, msgspec.json.format(msgspec.json.encode(state)))

    def write_slurm_job(self, job: str) -> None:
        """Record the job ``up`` submitted. Atomic, as the state is: ``status`` or
        ``down`` in another shell may read it the moment it appears."""
        _write_private(self.path / JOB_FILE, f"{job}\n".encode())


def _write_private(path: Path, data: bytes) -> None:
    """Write, then rename (a reader sees the old file or the whole new one), readable by
    the owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def deployments(root: Path | None = None) -> list[RunDir]:
    """Every deployment with a run directory, running or not, by name."""
    runs = (root or home()) / "runs"
    if not runs.is_dir():
        return []
    return [RunDir(p.name, root) for p in sorted(runs.iterdir()) if RunDir(p.name, root).known()]
