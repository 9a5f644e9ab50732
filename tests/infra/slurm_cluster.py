"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd of its own.

Everything lives under one directory (config, state, spool, logs, munge key and socket) and
uses free ports, so it does not clash with a system Slurm or munged, nor with another test
session's cluster. Client commands find it through ``SLURM_CONF`` in :attr:`SlurmCluster.env`
(pass that environment to every ``sbatch``/``srun``/``squeue``/``scancel``); the munge socket
is named in slurm.conf (``AuthInfo``), so clients need nothing else.

Facts this relies on (Slurm 22.05, no systemd, no cgroups):

- ``ProctrackType=proctrack/linuxproc`` tracks a step's processes by parentage, so a process
  that detaches (double fork) escapes ``scancel``; launchers keep components children of
  their step.
- ``SlurmdParameters=config_overrides`` lets the node declare more CPUs than it has, so
  several steps and jobs run at once on a 2-core machine.
- Two fake GPUs (``gpu:2``, device files that are links to ``/dev/null``) make slurmstepd
  set ``CUDA_VISIBLE_DEVICES`` the way it does on a GPU node.
- Stopping slurmd does not stop running steps (slurmstepd is a process of its own): the
  teardown cancels every job, waits for the queue to empty, then stops the daemons and
  kills whatever still carries this cluster's ``SLURM_CONF`` in its environment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol")
PARTITION = "debug"
FAKE_GPUS = 2
KILL_WAIT_S = 5  # scancel: SIGTERM, this long, SIGKILL (Slurm's default is 30 s)


@dataclass
class SlurmCluster:
    """What a test needs to talk to the cluster."""

    conf: Path
    env: dict[str, str]
    """``os.environ`` plus ``SLURM_CONF``: the environment for client commands."""
    node: str
    partition: str
    root: Path
    gpus: int = FAKE_GPUS
    logs: dict[str, Path] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """Run a client command against this cluster; its stdout."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def log_tails(self, lines: int = 20) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _node_line() -> tuple[str, int]:
    """This machine's node name as slurmd sees it, and its CPU count."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
    return fields["NodeName"], int(fields.get("CPUs", "1"))


def _write_config(root: Path, node: str, cpus: int) -> Path:
    ctld_port, slurmd_port = _free_ports(2)
    dev = root / "dev"
    dev.mkdir()
    for index in range(FAKE_GPUS):
        (dev / f"nvidia{index}").symlink_to("/dev/null")
    (root / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName={node} Name=gpu File={dev}/nvidia[0-{FAKE_GPUS - 1}]\n"
    )
    (root / "plugstack.conf").write_text("")  # no site SPANK plugins (pyxis, ...)
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=dyntest{secrets.token_hex(3)}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait={KILL_WAIT_S}
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={max(8, cpus)} RealMemory=1024 Gres=gpu:{FAKE_GPUS}
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _start_munged(root: Path) -> subprocess.Popen[bytes]:
    """munged with its own key and socket; as root it needs ``--force``."""
    munge = root / "munge"
    munge.mkdir(mode=0o711)
    munge.chmod(0o711)  # clients must reach the socket; mkdir's mode is masked
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    argv = ["munged", "--foreground", f"--socket={munge}/munge.socket", f"--key-file={key}"]
    argv += [f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid"]
    argv += [f"--seed-file={munge}/munged.seed"]
    if os.geteuid() == 0:
        argv.append("--force")
    with open(root / "log" / "munged.out", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    _wait_for(lambda: (munge / "munge.socket").exists() or proc.poll() is not None, 10)
    if proc.poll() is not None:
        raise RuntimeError(f"munged exited with {proc.returncode}: see {root}/log/munged.out")
    return proc


def _wait_for(ready: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(interval)
    return False


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = 10) -> None:
    """terminate → deadline → kill, then reap."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _kill_stragglers(conf: Path) -> None:
    """Processes of this cluster that outlived its daemons (slurmstepd, tasks, sruns)."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        try:
            ours = proc.pid != me and proc.environ().get("SLURM_CONF") == str(conf)
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(found, timeout=5)


def _cancel_all(cluster: SlurmCluster) -> None:
    """Cancel every job and wait (bounded) until the queue is empty, steps included."""
    with contextlib.suppress(Exception):
        cluster.run("scancel", f"--partition={cluster.partition}", check=False)
        _wait_for(lambda: not cluster.run("squeue", "-h", "-o", "%i", check=False).strip(), 30, 0.2)


@contextlib.contextmanager
def slurm_cluster(tmp_dir: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``tmp_dir``; yield once the node is idle."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm/munge binaries missing: {', '.join(missing)}")
    # Unix socket paths are limited to 108 bytes: keep the tree short.
    base = tmp_dir if len(str(tmp_dir)) < 60 else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir=base))
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    node, cpus = _node_line()
    conf = _write_config(root, node, cpus)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in [key for key in env if key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))]:
        if name != "SLURM_CONF":
            del env[name]  # an outer allocation's variables would leak into test jobs
    logs = {name: root / "log" / f"{name}.log" for name in ("slurmctld", "slurmd")}
    logs["munged"] = root / "munge" / "munged.log"
    cluster = SlurmCluster(conf=conf, env=env, node=node, partition=PARTITION, root=root)
    cluster.logs = logs
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(_start_munged(root))
        for argv in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
            with open(root / "log" / f"{argv[0]}.out", "ab") as out:
                daemons.append(
                    subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
                )

        def idle() -> bool:
            if any(proc.poll() is not None for proc in daemons):
                raise RuntimeError(f"a Slurm daemon exited:\n{cluster.log_tails()}")
            state = cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False)
            return state.strip() == "idle"

        if not _wait_for(idle, 30):
            raise RuntimeError(f"node {node} not idle after 30 s:\n{cluster.log_tails()}")
        yield cluster
    finally:
        if daemons:
            _cancel_all(cluster)
        _stop(list(reversed(daemons)))
        _kill_stragglers(conf)
        shutil.rmtree(root, ignore_errors=True)
