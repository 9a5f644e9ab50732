"""Real Slurm clusters for tests: munged, slurmctld and slurmd of their own.

Two shapes share everything but where the daemons run:

- :func:`slurm_cluster`: one node, slurmctld and slurmd in this network namespace on
  127.0.0.1 (free ports), the node named as this machine (``slurmd -C``).
- :func:`multinode_cluster`: named hosts on a private bridge (:mod:`tests.infra.netns`):
  slurmctld on its own host ``dynTAG-ctld``, compute nodes ``dynTAG-node1`` ... each a
  ``slurmd -N NAME`` in its own network and UTS namespace (its hostname is its node name),
  and a login host ``dynTAG-login`` that is no node, to submit from. Node names carry no
  ``NodeAddr``: Slurm resolves them (``/etc/hosts``) to the bridge addresses, so daemons,
  steps and clients reach each other by name. Daemons listen on Slurm's default ports
  (6817/6818): every host has its own network.

Everything lives under one directory (config, state, spool, logs, munge key and socket) and
uses free ports (single node) or namespaces of its own (multi-node; munged runs on the
controller host), so it does not clash with a system Slurm or munged, nor with another test
session's cluster. Client commands find it through ``SLURM_CONF`` in :attr:`SlurmCluster.env`
(pass that environment to every ``sbatch``/``srun``/``squeue``/``scancel``); the munge socket
is named in slurm.conf (``AuthInfo``), so clients need nothing else.

Facts this relies on (Slurm 22.05, no systemd, no cgroups):

- ``ProctrackType=proctrack/linuxproc`` tracks a step's processes by parentage, so a process
  that detaches (double fork) escapes ``scancel``; launchers keep components children of
  their step.
- ``SlurmdParameters=config_overrides`` lets the node declare more CPUs than it has, so
  several steps and jobs run at once on a 2-core machine.
- Two fake GPUs per node (``gpu:2``, device files that are links to ``/dev/null``) make
  slurmstepd set ``CUDA_VISIBLE_DEVICES`` the way it does on a GPU node: with no cgroup
  device constraint the indices are the node's own (a job given the second GPU sees ``1``).
- Several slurmd on one machine: Slurm expands ``%n`` (the node name) in
  ``SlurmdSpoolDir``, ``SlurmdPidFile`` and ``SlurmdLogFile``. slurmctld accepts to run
  only on a host whose hostname is named in ``SlurmctldHost`` (hence its own UTS namespace).
- slurmd refuses to start where ``/sys/fs/cgroup`` is not mounted ("Unable to initialize
  cgroup plugin"), even with ``proctrack/linuxproc``: hosts are entered with ``nsenter``,
  not ``ip netns exec`` (see :mod:`tests.infra.netns`).
- srun (from the login host, this namespace or a batch script) is reached back by slurmd
  and slurmstepd at the address its request came from: the bridge address of its host.
- Stopping slurmd does not stop running steps (slurmstepd is a process of its own): the
  teardown cancels every job, waits for the queue to empty, then stops the daemons and
  kills whatever still carries this cluster's ``SLURM_CONF`` in its environment.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.infra.netns import NetHost, Network, network, new_tag, own_disk, require_tools
from tests.infra.ports import free_ports

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol")
PARTITION = "debug"
FAKE_GPUS = 2
KILL_WAIT_S = 5  # scancel: SIGTERM, this long, SIGKILL (Slurm's default is 30 s)
NODE_CPUS = 8  # declared per node (SlurmdParameters=config_overrides)


@dataclass
class SlurmCluster:
    """What a test needs to talk to the cluster."""

    conf: Path
    env: dict[str, str]
    """``os.environ`` plus ``SLURM_CONF``: the environment for client commands."""
    node: str
    """The (first) compute node."""
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


@dataclass(kw_only=True)
class MultiNodeCluster(SlurmCluster):
    """A cluster of named hosts: compute nodes, a controller and a login host.

    :meth:`run` runs a client command in this (the test's) namespace, which reaches the
    controller over the bridge; ``run(..., on_login=True)`` or :meth:`login` run it on the
    login host, as a user would."""

    nodes: list[str]
    """Compute node names (= their hostnames), in order."""
    addresses: dict[str, str]
    """Compute node name → its address on the bridge (what the name resolves to)."""
    controller: NetHost
    """slurmctld's host (name, address, namespace)."""
    login_host: NetHost
    """The login host: not a node; its hostname is ``login_host.name``."""
    network: Network
    """All hosts (controller, nodes, login) and the bridge."""

    def login(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on the login host (its network and hostname); pass :attr:`env`."""
        return self.login_host.argv(argv)

    def on_node(self, node: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on compute node ``node`` outside Slurm (no job, no step)."""
        return self.network.host(node).argv(argv)

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30, on_login: bool = False
    ) -> str:
        """Run a client command here, or on the login host; its stdout."""
        command = self.login(argv) if on_login else list(argv)
        return super().run(*command, check=check, timeout=timeout)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _node_line() -> tuple[str, int]:
    """This machine's node name as slurmd sees it, and its CPU count."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
    return fields["NodeName"], int(fields.get("CPUs", "1"))


def _write_config(
    root: Path,
    *,
    controller: str,
    nodes: dict[str, str | None],
    cpus: int = NODE_CPUS,
    ports: tuple[int, int],
    per_node: bool,
) -> Path:
    """slurm.conf (and gres.conf, plugstack.conf) under ``root``.

    ``controller``: ``SlurmctldHost``; ``nodes``: name → ``NodeAddr`` (None: the name
    resolves); ``cpus``: declared per node; ``per_node``: slurmd spool, pid and log file
    per node (``%n``), for several slurmd sharing ``root``."""
    ctld_port, slurmd_port = ports
    dev = root / "dev"
    dev.mkdir()
    for index in range(FAKE_GPUS):
        (dev / f"nvidia{index}").symlink_to("/dev/null")
    gres = [f"NodeName={node} Name=gpu File={dev}/nvidia[0-{FAKE_GPUS - 1}]" for node in nodes]
    (root / "gres.conf").write_text("AutoDetect=off\n" + "\n".join(gres) + "\n")
    (root / "plugstack.conf").write_text("")  # no site SPANK plugins (pyxis, ...)
    node_lines = [
        f"NodeName={node}{f' NodeAddr={addr}' if addr else ''} CPUs={cpus} "
        f"RealMemory=1024 Gres=gpu:{FAKE_GPUS}"
        for node, addr in nodes.items()
    ]
    each = "-%n" if per_node else ""
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=dyntest{secrets.token_hex(3)}
SlurmctldHost={controller}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool{each}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd{each}.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd{each}.log
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
{chr(10).join(node_lines)}
PartitionName={PARTITION} Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _start_munged(root: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """munged with its own key and socket; as root it needs ``--force``. ``prefix``: where
    it runs (the socket is a path: every network namespace reaches it)."""
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
        proc = subprocess.Popen([*prefix, *argv], stdout=out, stderr=subprocess.STDOUT)
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


ROOT_BASE_MAX = 30
"""Longest directory the cluster's tree may sit in. Unix socket paths are limited to 108
bytes, and slurmstepd's longest is ``ROOT/spool-NODE/NODE_JOB.STEP``: about 72 bytes past
the base with this module's node names. A pytest-xdist worker's temp directory
(``/tmp/pytest-of-root/pytest-234/popen-gw1/mn0``, 43 bytes) is already too long."""


def _make_root(tmp_dir: Path) -> Path:
    # Unix socket paths are limited to 108 bytes: keep the tree short.
    base = tmp_dir if len(str(tmp_dir)) <= ROOT_BASE_MAX else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir=base))
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    return root


def _client_env(conf: Path) -> dict[str, str]:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in [key for key in env if key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))]:
        if name != "SLURM_CONF":
            del env[name]  # an outer allocation's variables would leak into test jobs
    return env


@contextlib.contextmanager
def _daemons(
    cluster: SlurmCluster,
    starts: dict[str, list[str]],
    nodes: list[str],
    munged_prefix: Sequence[str] = (),
) -> Iterator[None]:
    """munged (run with ``munged_prefix``), then the daemons of ``starts`` (log name →
    argv); yields once every node of ``nodes`` is idle. On exit (also on failure): cancel
    every job, stop the daemons, kill what still carries this cluster's ``SLURM_CONF``."""
    root = cluster.root
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(_start_munged(root, munged_prefix))
        for name, argv in starts.items():
            with open(root / "log" / f"{name}.out", "ab") as out:
                daemons.append(
                    subprocess.Popen(
                        argv,
                        env=cluster.env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

        def idle() -> bool:
            if any(proc.poll() is not None for proc in daemons):
                raise RuntimeError(f"a Slurm daemon exited:\n{cluster.log_tails()}")
            out = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(node) == "idle" for node in nodes)

        if not _wait_for(idle, 30):
            raise RuntimeError(f"nodes {nodes} not idle after 30 s:\n{cluster.log_tails()}")
        yield
    finally:
        if daemons:
            _cancel_all(cluster)
        _stop(list(reversed(daemons)))
        _kill_stragglers(cluster.conf)


@contextlib.contextmanager
def slurm_cluster(tmp_dir: Path) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``tmp_dir``; yield once the node is idle."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm/munge binaries missing: {', '.join(missing)}")
    root = _make_root(tmp_dir)
    try:
        node, cpus = _node_line()
        ctld_port, slurmd_port = free_ports(2)
        conf = _write_config(
            root,
            controller=f"{node}(127.0.0.1)",
            nodes={node: "127.0.0.1"},
            cpus=max(NODE_CPUS, cpus),
            ports=(ctld_port, slurmd_port),
            per_node=False,
        )
        cluster = SlurmCluster(
            conf=conf, env=_client_env(conf), node=node, partition=PARTITION, root=root
        )
        cluster.logs = {name: root / "log" / f"{name}.log" for name in ("slurmctld", "slurmd")}
        cluster.logs["munged"] = root / "munge" / "munged.log"
        starts = {
            "slurmctld": ["slurmctld", "-D", "-i", "-f", str(conf)],
            "slurmd": ["slurmd", "-D", "-f", str(conf)],
        }
        with _daemons(cluster, starts, [node]):
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def multinode_cluster(
    tmp_dir: Path, nodes: int = 3, node_local: Path | None = None
) -> Iterator[MultiNodeCluster]:
    """A controller host, ``nodes`` compute nodes and a login host, all named (see the
    module's docstring); yields once every node is idle. ``node_local``: a path each
    node sees as its own disk (its slurmd, and so its steps, in a mount namespace with
    ``ROOT/node-local-NAME`` bound there), as a node's local disk is. Everything is gone afterwards:
    jobs, daemons, stragglers, namespaces, ``/etc/hosts`` lines, files."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm/munge binaries missing: {', '.join(missing)}")
    require_tools()
    tag = new_tag()
    controller = f"dyn{tag}-ctld"
    names = [f"dyn{tag}-node{i + 1}" for i in range(nodes)]
    login = f"dyn{tag}-login"
    root = _make_root(tmp_dir)
    try:
        with network([controller, *names, login], tag) as net:
            conf = _write_config(
                root,
                controller=controller,
                nodes=dict.fromkeys(names),
                ports=(6817, 6818),
                per_node=True,
            )
            for name in names:
                (root / f"spool-{name}").mkdir()
            cluster = MultiNodeCluster(
                conf=conf,
                env=_client_env(conf),
                node=names[0],
                partition=PARTITION,
                root=root,
                nodes=names,
                addresses={name: net.host(name).address for name in names},
                controller=net.host(controller),
                login_host=net.host(login),
                network=net,
            )
            cluster.logs = {"slurmctld": root / "log" / "slurmctld.log"}
            for name in names:
                cluster.logs[f"slurmd {name}"] = root / "log" / f"slurmd-{name}.log"
            cluster.logs["munged"] = root / "munge" / "munged.log"
            starts = {
                "slurmctld": net.host(controller).argv(["slurmctld", "-D", "-i", "-f", str(conf)])
            }
            for name in names:
                slurmd = ["slurmd", "-D", "-N", name, "-f", str(conf)]
                if node_local is not None:
                    slurmd = own_disk(root / f"node-local-{name}", node_local, slurmd)
                starts[f"slurmd-{name}"] = net.host(name).argv(slurmd)
            # munged on the controller host too: a later session's clean-up of a killed
            # one's namespaces ends it with the rest.
            with _daemons(cluster, starts, names, net.host(controller).argv()):
                yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)
