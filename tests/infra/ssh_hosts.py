"""Real SSH hosts for tests: one sshd per named host (a network namespace, see
:mod:`tests.infra.netns`).

``ssh_hosts(n, tmp_dir)`` builds ``n`` hosts on a private bridge network, each with its own
hostname (``dynhostI-TAG``) that resolves to its address through ``/etc/hosts``, its own
sshd (key-only, root allowed) and a ``known_hosts`` file listing each host by name and by
address. Needs root, ``ip`` (iproute2), ``unshare`` and openssh-server.

Facts this relies on:

- Namespaces separate only the network (and the hostname): processes started over SSH see
  this filesystem and these pids, so the remote python is ``sys.executable`` and a test can
  watch remote processes with psutil.
- The login shell runs the remote commands: root's is bash, which sources ``~/.bashrc``
  when run by sshd (Debian), about 0.1 s per command here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.infra.netns import NetHost, in_namespace, network, new_tag, own_disk, require_tools

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SshHosts:
    """What a test needs to reach the hosts."""

    names: list[str]
    """Host names, in namespace order: each is the host's hostname (what
    ``socket.gethostname()`` says there) and resolves to its address (``/etc/hosts``)."""
    addresses: list[str]
    """Host addresses, in namespace order."""
    namespaces: list[str]
    """Network namespace of each host (for ``ip netns exec``)."""
    port: int
    user: str
    key: Path
    """Private key that every host accepts."""
    known_hosts: Path
    """The hosts' keys, by name and by address."""
    unused_address: str
    """An address on the hosts' network with no host behind it."""

    @property
    def hostnames(self) -> list[str]:
        """Same as :attr:`names`."""
        return self.names

    def target_yaml(self, workdir: Path | str, python: Path | str = sys.executable) -> str:
        """A recipe's ``target:`` section reaching these hosts by name, as the ``ssh``
        launcher does: their user, port, key and known_hosts, ``python`` and ``workdir``."""
        return f"""\
target:
  kind: ssh
  hosts: [{", ".join(self.names)}]
  user: {self.user}
  port: {self.port}
  key: {self.key}
  known_hosts: {self.known_hosts}
  python: {python}
  workdir: {workdir}"""

    def netns_exec(self, index: int) -> list[str]:
        """Prefix that runs a command on host ``index`` (its network and hostname)."""
        return in_namespace(self.namespaces[index], self.names[index])


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at ``path`` (and ``path.pub``); returns ``path``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dynamoctl-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def tree_python(tmp: Path) -> Path:
    """A python for the hosts: this interpreter with this tree first on its path (an ssh
    launch runs ``python -m dynamoctl`` in the target's workdir, which would import
    whichever dynamoctl is installed)."""
    wrapper = tmp / "python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@contextlib.contextmanager
def ssh_hosts(
    n: int,
    tmp_dir: Path,
    *,
    max_sessions: int = 10,
    host_env: Sequence[Mapping[str, str]] = (),
    node_local: Path | None = None,
) -> Iterator[SshHosts]:
    """``n`` hosts, each a namespace with an sshd; everything is removed on exit.
    ``host_env[i]``: variables every session on host ``i`` starts with (sshd's
    ``SetEnv``), e.g. a different ``CUDA_VISIBLE_DEVICES`` per "node" of one machine.
    ``node_local``: a path each host sees as its own disk (host ``i``'s sshd runs in a
    mount namespace of its own with ``tmp_dir/node-local-i`` bound there), as a node's
    local disk is the same path on every node of a cluster."""
    require_tools(SSHD, "ssh-keygen")
    tag = new_tag()
    key = keygen(tmp_dir / "client_key")
    (tmp_dir / "authorized_keys").write_text((tmp_dir / "client_key.pub").read_text())
    daemons: list[subprocess.Popen[bytes]] = []
    with network([f"dynhost{i + 1}-{tag}" for i in range(n)], tag) as net:
        try:
            known = []
            for i, host in enumerate(net.hosts):
                host_key = keygen(tmp_dir / f"host_key_{i}")
                public = (tmp_dir / f"host_key_{i}.pub").read_text().strip()
                known.append(f"{host.name},{host.address} {public}")
                config = tmp_dir / f"sshd_config_{i}"
                env = host_env[i] if i < len(host_env) else {}
                config.write_text(_sshd_config(host.address, host_key, tmp_dir, max_sessions, env))
                own = None
                if node_local is not None:
                    own = (tmp_dir / f"node-local-{i}", node_local)
                daemons.append(_start_sshd(host, config, tmp_dir / f"sshd_{i}.log", own))
            (tmp_dir / "known_hosts").write_text("\n".join(known) + "\n")
            for i, host in enumerate(net.hosts):
                _wait_listening(host.address, 22, daemons[i], tmp_dir / f"sshd_{i}.log")
            yield SshHosts(
                names=[host.name for host in net.hosts],
                addresses=[host.address for host in net.hosts],
                namespaces=[host.namespace for host in net.hosts],
                port=22,
                user="root",
                key=key,
                known_hosts=tmp_dir / "known_hosts",
                unused_address=net.unused_address,
            )
        finally:
            for daemon in daemons:
                daemon.kill()
                daemon.wait(10)


def _sshd_config(
    addr: str, host_key: Path, tmp_dir: Path, max_sessions: int, env: Mapping[str, str]
) -> str:
    set_env = f"SetEnv {' '.join(f'{k}={v}' for k, v in env.items())}\n" if env else ""
    return (
        set_env
        + f"""\
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
    )


def _start_sshd(
    host: NetHost, config: Path, log: Path, own: tuple[Path, Path] | None = None
) -> subprocess.Popen[bytes]:
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    sshd = [SSHD, "-D", "-e", "-f", str(config)]
    if own is not None:  # (its own directory, the path the host sees it at)
        sshd = own_disk(own[0], own[1], sshd)
    with open(log, "ab") as out:
        return subprocess.Popen(
            host.argv(sshd),
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
