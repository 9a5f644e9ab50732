"""A "shared filesystem" served from its own namespace host over the network, with a
bandwidth limit on that host's link: what a Lustre/NFS mount is to a cluster's nodes.

``sftp-server`` (OpenSSH's) runs in the file server's namespace behind a small TCP
acceptor (one server process per connection, no SSH authentication: the network exists
only on this machine), ``tc`` limits what the server sends (a token bucket on its
``eth0``), and ``sshfs -o directport`` mounts the export at one path that every namespace
host sees (namespaces share this machine's mounts): every read of the mount crosses the
throttled link. ``direct_io``: no page cache in front of the mount, so each read is a
network read, as each node's own read of a shared filesystem is. The kernel's NFS server
is not used: it cannot be started in a container without its modules.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.infra.netns import NetHost

SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")
PORT = 7022

ACCEPTOR = """
import socket, subprocess, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
while True:
    c, _ = s.accept()
    subprocess.Popen([sys.argv[3]], stdin=c.fileno(), stdout=c.fileno(), cwd="/")
    c.close()
"""


@dataclass(frozen=True)
class SharedFs:
    mount: Path
    """Where every host reads the export."""
    server: NetHost
    rate_mbit: int


def require() -> None:
    for tool in ("sshfs", "fusermount", "tc"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found (scripts/install-deps.sh installs sshfs)")
    if not SFTP_SERVER.exists() or not Path("/dev/fuse").exists():
        raise RuntimeError(f"needs {SFTP_SERVER} (openssh-server) and /dev/fuse")


@contextlib.contextmanager
def shared_fs(server: NetHost, export: Path, mount: Path, rate_mbit: int) -> Iterator[SharedFs]:
    """``export`` served by ``server`` at ``rate_mbit`` and mounted (read-only) at
    ``mount``; unmounted and stopped on exit."""
    require()
    netns = ["nsenter", f"--net=/run/netns/{server.namespace}"]
    tbf = ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf"]
    tbf += ["rate", f"{rate_mbit}mbit", "burst", "256kb", "latency", "200ms"]
    subprocess.run([*netns, *tbf], check=True, capture_output=True)
    acceptor = subprocess.Popen(
        server.argv([sys.executable, "-c", ACCEPTOR, server.address, str(PORT), str(SFTP_SERVER)])
    )
    mount.mkdir(parents=True, exist_ok=True)
    try:
        _wait_listening(server.address, PORT, acceptor)
        options = f"ro,direct_io,directport={PORT},reconnect"
        subprocess.run(
            ["sshfs", "-o", options, f"{server.address}:{export}", str(mount)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        yield SharedFs(mount=mount, server=server, rate_mbit=rate_mbit)
    finally:
        subprocess.run(["fusermount", "-u", "-z", str(mount)], capture_output=True, check=False)
        acceptor.kill()
        acceptor.wait()


def _wait_listening(addr: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SFTP acceptor exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((addr, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {addr}:{port}")
