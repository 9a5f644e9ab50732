"""Run a real etcd server as a child process (managed discovery, and the tests).

``dynamoctl up`` starts one on the head node when a recipe asks for ``managed: true``;
the test suite uses the same class, so what the tests exercise is what users run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just reported free on ``host`` (racy, good enough for children)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    ) -> None:
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="dynamoctl-etcd-"))
        self._binary = binary
        self._log_file = Path(log_file) if log_file else self.data_dir.with_suffix(".log")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
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
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> ManagedEtcd:
        """Start etcd and wait until ``/health`` says so; raises with the log tail if not."""
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
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=0.5) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError):
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
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
