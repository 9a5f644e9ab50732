"""Run a real etcd server as a child process (managed discovery, and the tests).

``dynamoctl up`` starts one on the head node when a recipe asks for ``managed: true``;
the test suite uses the same class, so what the tests exercise is what users run.

With TLS (docs/security.md, "Managed etcd") etcd serves clients and peers over HTTPS and
accepts only certificates signed by the deployment's CA. etcd reads its certificate from
files only, so under ``dynamoctl up`` it starts through ``python -m
dynamoctl.discovery.etcd_server DIR etcd ARGS...``, which writes the PEM material it
received in its environment into DIR (mode 0700, files 0600) on etcd's own host and
``exec``s etcd with :func:`tls_flags` added and that material gone from its environment.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dynamoctl.security import names

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just reported free on ``host`` (racy, good enough for children)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class EtcdTlsFiles:
    """PEM files of a TLS etcd: its CA, its own certificate and key, and a client
    certificate and key (what :meth:`ManagedEtcd.healthy` presents)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert is not None and self.client_key is not None:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def tls_flags(ca: str | Path, cert: str | Path, key: str | Path) -> list[str]:
    """etcd's flags for HTTPS with client certificates required, to clients and peers
    (one certificate serves both: it carries server and client usage)."""
    return [
        f"--cert-file={cert}", f"--key-file={key}",
        f"--trusted-ca-file={ca}", "--client-cert-auth",
        f"--peer-cert-file={cert}", f"--peer-key-file={key}",
        f"--peer-trusted-ca-file={ca}", "--peer-client-cert-auth",
    ]  # fmt: skip


class ManagedEtcd:
    """One etcd member on ``host``, started by :meth:`start`, stopped by :meth:`stop`.

    Fast-failover timings (10 ms heartbeat, 100 ms election) make it healthy in well
    under a second and allow lease TTLs down to 2 s on a single member.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        client_port: int | None = None,
        peer_port: int | None = None,
        binary: str = "etcd",
        log_file: str | os.PathLike[str] | None = None,
        tls: EtcdTlsFiles | None = None,
    ) -> None:
        self.host = host
        self.tls = tls
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="dynamoctl-etcd-"))
        self._binary = binary
        self._log_file = Path(log_file) if log_file else self.data_dir.with_suffix(".log")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        peer = f"{self.scheme}://{self.host}:{self.peer_port}"
        tls = tls_flags(self.tls.ca, self.tls.cert, self.tls.key) if self.tls else []
        return [
            self._binary,
            "--name", "dynamoctl",
            "--data-dir", str(self.data_dir / "member"),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"dynamoctl={peer}",
            "--heartbeat-interval", "10",
            "--election-timeout", "100",
            *tls,
        ]  # fmt: skip

    @property
    def running(self) -> bool:
        """Whether the etcd process this started is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 15.0) -> ManagedEtcd:
        """Start etcd and wait until ``/health`` says so; raises with the log tail if not.
        A second start while it runs is refused: the new process could not bind the
        ports, and the running one would be left without an owner."""
        if self.running:
            raise RuntimeError(f"etcd at {self.endpoint} is already running")
        binary = shutil.which(self._binary)
        if binary is None:
            raise FileNotFoundError(
                f"etcd binary {self._binary!r} not found on PATH "
                "(Debian/Ubuntu: apt-get install etcd-server)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_file, "ab") as out:
            self._proc = subprocess.Popen(
                [binary, *self.command()[1:]],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: killable as one, immune to our ^C
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self._proc.returncode}: {self._tail()}")
            if self.healthy():
                log.info("etcd ready at %s (pid %d)", self.endpoint, self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"etcd at {self.endpoint} not healthy after {timeout}s: {self._tail()}")

    def healthy(self) -> bool:
        try:
            context = self.tls.client_context() if self.tls else None
            url = f"{self.endpoint}/health"
            with urllib.request.urlopen(url, timeout=0.5, context=context) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the group, wait up to ``grace``, then SIGKILL. Data dir is kept."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def wipe(self) -> None:
        """Delete the data dir (the server must be stopped): a restart then starts empty."""
        assert self._proc is None, "stop etcd before wiping its data"
        shutil.rmtree(self.data_dir / "member", ignore_errors=True)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self._log_file.unlink(missing_ok=True)

    def _tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self._log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ManagedEtcd:
        """Start it, unless ``start()`` (with its own timeout) already did."""
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


_TLS_MATERIAL = {
    "ca.pem": names.ETCD_CA,
    "server.pem": names.ETCD_SERVER_CERT,
    "server.key": names.ETCD_SERVER_KEY,
}


def exec_with_tls(directory: Path, argv: list[str]) -> None:
    """Write the TLS material from the environment into ``directory`` and become etcd."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    env = dict(os.environ)
    for filename, variable in _TLS_MATERIAL.items():
        pem = env.pop(variable, "")
        if not pem:
            raise SystemExit(f"etcd TLS: {variable} is not set")
        path = directory / filename
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(pem if pem.endswith("\n") else pem + "\n")
    flags = tls_flags(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    binary = shutil.which(argv[0]) or argv[0]
    os.execve(binary, [*argv, *flags], env)


if __name__ == "__main__":  # python -m dynamoctl.discovery.etcd_server DIR etcd ARGS...
    exec_with_tls(Path(sys.argv[1]), sys.argv[2:])
