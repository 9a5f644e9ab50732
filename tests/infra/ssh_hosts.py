"""Real SSH hosts for tests: one sshd per network namespace, behind a private bridge.

``ssh_hosts(n, tmp_dir)`` builds a /24 that exists only inside this machine (a bridge in the
root namespace at ``.1``, hosts at ``.2``, ``.3``, ...), one namespace per host with its own
hostname (``unshare --uts``) and its own sshd (key-only, root allowed), and a
``known_hosts`` file for them. Needs root, ``ip`` (iproute2), ``unshare`` and openssh-server.

Facts this relies on:

- Namespaces separate only the network (and the hostname): processes started over SSH see
  this filesystem and these pids, so the remote python is ``sys.executable`` and a test can
  watch remote processes with psutil.
- The login shell runs the remote commands: root's is bash, which sources ``~/.bashrc``
  when run by sshd (Debian), about 0.1 s per command here.
- Names carry this process's pid, so parallel sessions do not collide; namespaces left by a
  session that was killed are removed by the next one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
_PREFIX = "dynssh"  # namespaces: dynssh-PID-K-I; bridge dsbPIDK; veths dsvPIDKxI
_counter = itertools.count()


@dataclass(frozen=True)
class SshHosts:
    """What a test needs to reach the hosts."""

    addresses: list[str]
    """Host addresses, in namespace order."""
    hostnames: list[str]
    """What ``socket.gethostname()`` says on each host."""
    namespaces: list[str]
    """Network namespace of each host (for ``ip netns exec``)."""
    port: int
    user: str
    key: Path
    """Private key that every host accepts."""
    known_hosts: Path
    """The hosts' keys, by address."""
    unused_address: str
    """An address on the hosts' network with no host behind it."""

    def netns_exec(self, index: int) -> list[str]:
        """Prefix that runs a command on host ``index``."""
        return ["ip", "netns", "exec", self.namespaces[index]]


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at ``path`` (and ``path.pub``); returns ``path``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dynamoctl-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


@contextlib.contextmanager
def ssh_hosts(n: int, tmp_dir: Path, *, max_sessions: int = 10) -> Iterator[SshHosts]:
    """``n`` hosts, each a namespace with an sshd; everything is removed on exit."""
    for tool in (SSHD, "ip", "unshare", "ssh-keygen", "hostname"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: apt-get install openssh-server iproute2")
    if os.geteuid() != 0:
        raise RuntimeError("ssh_hosts needs root (network namespaces)")
    _remove_stale()
    tag = f"{os.getpid()}{next(_counter) % 10}"
    subnet = _free_subnet()
    bridge = f"dsb{tag}"
    namespaces = [f"{_PREFIX}-{tag[:-1]}-{tag[-1]}-{i}" for i in range(n)]
    addresses = [f"{subnet}.{i + 2}" for i in range(n)]
    hostnames = [f"dynhost{i + 1}-{tag}" for i in range(n)]
    key = keygen(tmp_dir / "client_key")
    (tmp_dir / "authorized_keys").write_text((tmp_dir / "client_key.pub").read_text())
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        known = []
        for i, (ns, addr) in enumerate(zip(namespaces, addresses, strict=True)):
            _ip("netns", "add", ns)
            _ip("link", "add", f"dsv{tag}x{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"dsv{tag}x{i}", "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            host_key = keygen(tmp_dir / f"host_key_{i}")
            known.append(f"{addr} {(tmp_dir / f'host_key_{i}.pub').read_text().strip()}")
            config = tmp_dir / f"sshd_config_{i}"
            config.write_text(_sshd_config(addr, host_key, tmp_dir, max_sessions))
            daemons.append(_start_sshd(ns, hostnames[i], config, tmp_dir / f"sshd_{i}.log"))
        (tmp_dir / "known_hosts").write_text("\n".join(known) + "\n")
        for i, addr in enumerate(addresses):
            _wait_listening(addr, 22, daemons[i], tmp_dir / f"sshd_{i}.log")
        yield SshHosts(
            addresses=addresses,
            hostnames=hostnames,
            namespaces=namespaces,
            port=22,
            user="root",
            key=key,
            known_hosts=tmp_dir / "known_hosts",
            unused_address=f"{subnet}.250",
        )
    finally:
        for daemon in daemons:
            daemon.kill()
            daemon.wait()
        for ns in namespaces:
            _remove_namespace(ns)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)


def _sshd_config(addr: str, host_key: Path, tmp_dir: Path, max_sessions: int) -> str:
    return f"""\
ListenAddress {addr}:22
HostKey {host_key}
AuthorizedKeysFile {tmp_dir / "authorized_keys"}
PidFile none
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
PrintLastLog no
MaxSessions {max_sessions}
"""


def _start_sshd(ns: str, hostname: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    script = 'hostname "$1" && exec "$2" -D -e -f "$3"'
    argv = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", script, "sh"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*argv, hostname, SSHD, str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_listening(addr: str, port: int, daemon: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((addr, port)) == 0:
                return
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {addr} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)


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


def _remove_namespace(ns: str) -> None:
    """Kill what runs in ``ns`` (sshd, sessions, instances), then delete it and its veth."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(psutil.Error):
            psutil.Process(int(pid)).kill()
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _remove_stale() -> None:
    """Namespaces and bridges of sessions whose process is gone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for match in re.finditer(rf"^({_PREFIX}-(\d+)-(\d)-\d+)", listing, re.MULTILINE):
        ns, pid, k = match.groups()
        if not psutil.pid_exists(int(pid)):
            _remove_namespace(ns)
            subprocess.run(["ip", "link", "del", f"dsb{pid}{k}"], capture_output=True, check=False)
