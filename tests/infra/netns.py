"""Named hosts on one machine: network namespaces behind a private bridge, with names.

``network(hostnames)`` builds a /24 that exists only inside this machine (a bridge in the
root namespace at ``.1``, hosts at ``.2``, ``.3``, ...) with one namespace per host, and
makes every host's name resolve to its address by adding ``ADDRESS NAME`` lines to
``/etc/hosts``. Commands run "on" a host through :func:`in_namespace` (``nsenter --net``
plus ``unshare --uts``), so they see the host's network and its hostname. Needs root,
``ip`` (iproute2), ``nsenter`` and ``unshare`` (util-linux).

Facts this relies on:

- Namespaces separate only the network (and, per process tree, the hostname): every host
  sees this filesystem and these pids. One ``/etc/hosts`` therefore serves all hosts and the
  root namespace alike, and names resolve the same everywhere (to the bridge addresses,
  never to loopback).
- Commands enter a namespace with ``nsenter --net``, not ``ip netns exec``: the latter
  gives the command a mount namespace with a fresh ``/sys`` of the network namespace, in
  which ``/sys/fs/cgroup`` is not mounted, and slurmd refuses to start without it ("Unable
  to initialize cgroup plugin", even with ``proctrack/linuxproc``). With ``nsenter`` the
  mounts are this machine's (``/sys/class/net`` lists the root namespace's interfaces; ask
  ``ip`` instead).
- A UTS namespace lives as long as its processes: each command run on a host gets a fresh
  one whose hostname is set before the command starts, and the command's children inherit
  it (slurmd's steps, sshd's sessions).
- ``nsenter`` and ``unshare`` (without ``--fork``) exec, and the ``sh -c`` wrapper
  ends with ``exec``: the process a caller starts *is* its command (its pid, its signals).
- Names carry this process's pid: namespaces ``dynns-PID-K-I``, bridge ``dnbPIDK``, veths
  ``dnvPIDKxI``, and ``/etc/hosts`` lines end with ``# dynamoctl-test pid=PID net=PIDK``.
  What a killed session left behind (namespaces, bridge, ``/etc/hosts`` lines of a pid that
  is gone) is removed by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

HOSTS_FILE = Path("/etc/hosts")
_HOSTS_LOCK = Path("/run/dynamoctl-test-hosts.lock")
_MARK = "# dynamoctl-test"
_PREFIX = "dynns"
_counter = itertools.count()
_WRAPPER = 'hostname "$1" && shift && exec "$@"'


def in_namespace(namespace: str, hostname: str) -> list[str]:
    """Prefix that runs a command in ``namespace`` with ``hostname`` as its hostname."""
    netns = f"--net=/run/netns/{namespace}"
    return ["nsenter", netns, "unshare", "--uts", "sh", "-c", _WRAPPER, "sh", hostname]


@dataclass(frozen=True)
class NetHost:
    """One host of a :class:`Network`."""

    name: str
    """Its hostname, and the name that resolves to :attr:`address` (``/etc/hosts``)."""
    address: str
    namespace: str
    """Network namespace (``ip netns``)."""

    def argv(self, command: Sequence[str] = ()) -> list[str]:
        """``command`` run on this host (with no command: the prefix alone)."""
        return [*in_namespace(self.namespace, self.name), *command]


@dataclass(frozen=True)
class Network:
    tag: str
    """Unique to this network among live sessions on this machine (``PIDK``)."""
    bridge: str
    gateway: str
    """The bridge's address: the root namespace as seen from the hosts."""
    hosts: list[NetHost]
    unused_address: str
    """An address on this network with no host behind it."""

    def host(self, name: str) -> NetHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def addresses(self) -> dict[str, str]:
        """Name → address, for every host."""
        return {host.name: host.address for host in self.hosts}


def require_tools(*extra: str) -> None:
    for tool in ("ip", "nsenter", "unshare", "hostname", *extra):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found (apt-get install iproute2 util-linux ...)")
    if os.geteuid() != 0:
        raise RuntimeError("named hosts need root (network namespaces, /etc/hosts)")


def new_tag() -> str:
    """A tag for the next :func:`network` of this process: ``PID`` and a digit whose bridge
    does not exist yet. Names built from it (hostnames) are unique among live sessions."""
    for _ in range(10):
        tag = f"{os.getpid()}{next(_counter) % 10}"
        if not Path(f"/sys/class/net/dnb{tag}").exists():
            return tag
    raise RuntimeError(f"ten networks of process {os.getpid()} exist already")


@contextlib.contextmanager
def network(hostnames: Sequence[str], tag: str | None = None) -> Iterator[Network]:
    """A bridge and one namespace per name, names in ``/etc/hosts``; all removed on exit,
    after killing whatever still runs in the namespaces."""
    require_tools()
    for name in hostnames:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", name):
            raise ValueError(f"not a usable hostname: {name!r}")
    remove_stale()
    tag = tag or new_tag()
    subnet = _free_subnet()
    bridge = f"dnb{tag}"
    hosts = [
        NetHost(name, f"{subnet}.{i + 2}", f"{_PREFIX}-{tag[:-1]}-{tag[-1]}-{i}")
        for i, name in enumerate(hostnames)
    ]
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, host in enumerate(hosts):
            ns, veth = host.namespace, f"dnv{tag}x{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        mark = f"{_MARK} pid={os.getpid()} net={tag}"
        _edit_hosts(lambda line: True, [f"{h.address} {h.name} {mark}" for h in hosts])
        for host in hosts:
            try:
                resolved = socket.gethostbyname(host.name)
            except OSError as exc:
                resolved = str(exc)
            if resolved != host.address:
                raise RuntimeError(
                    f"{host.name} resolves to {resolved}, not {host.address}: is {HOSTS_FILE} "
                    "consulted (hosts: files in /etc/nsswitch.conf)?"
                )
        yield Network(
            tag=tag,
            bridge=bridge,
            gateway=f"{subnet}.1",
            hosts=hosts,
            unused_address=f"{subnet}.250",
        )
    finally:
        for host in hosts:
            remove_namespace(host.namespace)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        _edit_hosts(lambda line: not (_MARK in line and line.endswith(f" net={tag}")), [])


def namespace_pids(namespace: str) -> list[int]:
    """Processes in ``namespace`` that are not zombies."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    alive = []
    for pid in map(int, out.stdout.split()):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


def remove_namespace(namespace: str) -> None:
    """SIGKILL what runs in ``namespace`` (bounded wait), then delete it and its veth."""
    procs = []
    for pid in namespace_pids(namespace):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
    # Not our children: PID 1 reaps them, late. Gone or a zombie is enough.
    deadline = time.monotonic() + 5
    while any(_running(proc) for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def remove_stale() -> None:
    """Namespaces, bridges and ``/etc/hosts`` lines of sessions whose process is gone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for match in re.finditer(rf"^({_PREFIX}-(\d+)-\d-\d+)", listing, re.MULTILINE):
        ns, pid = match.groups()
        if not psutil.pid_exists(int(pid)):
            remove_namespace(ns)
    for bridge in os.listdir("/sys/class/net"):
        found = re.fullmatch(r"dnb(\d+)\d", bridge)
        if found and not psutil.pid_exists(int(found.group(1))):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)

    def live(line: str) -> bool:
        found = re.search(rf"{_MARK} pid=(\d+) ", line)
        return found is None or psutil.pid_exists(int(found.group(1)))

    _edit_hosts(live, [])


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _edit_hosts(keep: Callable[[str], bool], add: list[str]) -> None:
    """Rewrite ``/etc/hosts``: the lines ``keep`` accepts, then ``add``. Under a lock, and
    by rename where it can (readers never see half a file); in place where ``/etc/hosts``
    is a mount point (containers)."""
    with open(_HOSTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = HOSTS_FILE.read_text().splitlines()
        new = [line for line in old if keep(line)] + add
        if new == old:
            return
        text = "\n".join(new) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".hosts.", dir=HOSTS_FILE.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            shutil.copymode(HOSTS_FILE, tmp)
            os.replace(tmp, HOSTS_FILE)
        except OSError:
            HOSTS_FILE.write_text(text)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _free_subnet() -> str:
    """A 10.77.X prefix no interface here uses (X from the pid, to keep sessions apart)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 200
    for x in range(start, start + 254):
        prefix = f"10.77.{x % 254 + 1}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.77.X.0/24 subnet")


_BIND = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def own_disk(own: Path, at: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` in a mount namespace of its own in which directory ``own`` is seen at
    ``at``: a node's local disk, the same path on every node of a cluster, each its own
    (an SSH host's sshd, a Slurm node's slurmd and the steps it starts)."""
    for path in (own, at):
        path.mkdir(parents=True, exist_ok=True)
    private = ["unshare", "--mount", "--propagation", "private"]
    return [*private, "sh", "-c", _BIND, "sh", str(own), str(at), *argv]
