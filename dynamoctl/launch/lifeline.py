"""The keeper's lifelines: who holds it alive, where its command's output goes, and the
socket a new supervisor attaches to (docs/architecture.md, "Keepers and lifelines").

A lifeline is the keeper's stdin (a pipe or SSH channel held by the supervisor that
launched it) or a connection to its unix socket (a supervisor that adopted it). The
keeper's orphan timer runs only while none is attached. Writes never block the relay:
each sink has a bounded queue and a thread of its own, so a stalled or dead channel loses
output but never stalls or kills the command. With no sink at all, a bounded tail is kept
for the next lifeline that attaches.

Standard library, psutil and the keeper's frames (``dynamoctl.wire.keeper``): it runs
inside every keeper.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

from dynamoctl.wire.keeper import (
    KeeperExit,
    KeeperHeader,
    KeeperOutput,
    encode_frame,
    recv_frame,
)

TAIL_BYTES = 256 * 1024
"""Output kept while no lifeline is attached (the newest bytes win)."""
SINK_QUEUE = 256
"""Chunks a slow sink may lag behind before its output is dropped."""
SUN_PATH_MAX = 107
"""Longest unix socket path (``sun_path`` is 108 bytes with its NUL)."""
NO_KEEPER = 3
"""Exit status of ``keeper attach`` when no keeper answers at the socket."""


def private_dir() -> Path:
    """A directory only this user can enter, for lifeline sockets: ``$XDG_RUNTIME_DIR/
    dynamoctl`` when that path is short enough, else ``/tmp/dynamoctl-UID``. Refused if it
    exists as anything else (a link, another owner, group or world access)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "dynamoctl" if runtime else None
    if base is None or len(str(base)) > SUN_PATH_MAX - 60:
        base = Path("/tmp") / f"dynamoctl-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{base} is not a directory private to uid {os.getuid()}")
    return base


def socket_path(name: str, pid: int) -> Path:
    """Where the keeper with ``pid`` listens, for an instance called ``name``."""
    return private_dir() / f"{name[:40]}-{pid}.sock"


class Sink:
    """One destination of frames or bytes, written by a thread of its own."""

    def __init__(self, write: Callable[[bytes], None], on_dead: Callable[[Sink], None]) -> None:
        self._write = write
        self._on_dead = on_dead
        self._queue: queue.Queue[bytes | None] = queue.Queue(SINK_QUEUE)
        self.dropped = 0
        self.dead = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> None:
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            self.dropped += len(data)

    def close(self, timeout: float) -> None:
        """Write what is queued (within ``timeout``), then stop."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._write(data)
            except OSError:
                self.dead = True
                self._on_dead(self)
                return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Lifelines:
    """The keeper's lifelines and output sinks, guarded by one condition."""

    def __init__(self, header: KeeperHeader, relay_to_stdout: bool) -> None:
        self.header = header
        self.relays = relay_to_stdout
        """Output goes through here (ssh); else the command writes to its log itself."""
        self._cond = threading.Condition()
        self._stdin_attached = True
        self._stdout: Sink | None = None
        if relay_to_stdout:
            self._stdout = Sink(lambda data: _write_all(1, data), self._sink_dead)
        self._sockets: dict[Sink, socket.socket] = {}
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._tail_dropped = 0
        self._ended = False

    def attached(self) -> int:
        with self._cond:
            return int(self._stdin_attached) + len(self._sockets)

    # -- lifelines coming and going ---------------------------------------------------------

    def stdin_closed(self) -> None:
        with self._cond:
            self._stdin_attached = False
            stdout, self._stdout = self._stdout, None  # the same channel: gone with it
            self._cond.notify_all()
        if stdout is not None:
            stdout.close(0.0)

    def attach(self, conn: socket.socket) -> None:
        """A new lifeline: header, the tail kept meanwhile, then live output and the end."""
        conn.sendall(encode_frame(self.header))
        sink = Sink(conn.sendall, self._sink_dead)
        with self._cond:
            if self._ended:  # too late: the command's end was announced already
                sink.close(0.0)
                conn.close()
                return
            if self._tail_dropped:
                note = f"[keeper] {self._tail_dropped} bytes of output dropped while detached\n"
                sink.put(encode_frame(KeeperOutput(note.encode())))
            for chunk in self._tail:
                sink.put(encode_frame(KeeperOutput(chunk)))
            self._tail.clear()
            self._tail_size = self._tail_dropped = 0
            self._sockets[sink] = conn
            self._cond.notify_all()
        self.say(f"lifeline attached ({self.attached()} now)")
        threading.Thread(target=self._until_closed, args=(sink, conn), daemon=True).start()

    def _until_closed(self, sink: Sink, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        self._detach(sink)

    def _sink_dead(self, sink: Sink) -> None:
        if sink is self._stdout:
            with self._cond:
                self._stdout = None
        else:
            self._detach(sink)

    def _detach(self, sink: Sink) -> None:
        with self._cond:
            conn = self._sockets.pop(sink, None)
            self._cond.notify_all()
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
            self.say(f"lifeline detached ({self.attached()} left)")

    # -- output -------------------------------------------------------------------------

    def output(self, data: bytes) -> None:
        """Relay a chunk of the command's output to every sink, or keep it in the tail."""
        with self._cond:
            sinks = list(self._sockets)
            if self._stdout is None and not sinks:
                self._keep(data)
                return
            stdout = self._stdout
        if stdout is not None:
            stdout.put(data)
        frame = encode_frame(KeeperOutput(data))
        for sink in sinks:
            sink.put(frame)

    def _keep(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size > TAIL_BYTES:
            self._tail_size -= len(old := self._tail.popleft())
            self._tail_dropped += len(old)

    def say(self, text: str) -> None:
        """A line of the keeper's own, where the command's output goes (else stderr)."""
        line = f"[keeper] {text}\n"
        if self.relays:
            self.output(line.encode())
            return
        with contextlib.suppress(OSError):  # stderr may be the very channel that just closed
            sys.stderr.write(line)
            sys.stderr.flush()

    # -- the end ----------------------------------------------------------------------------

    def wait_orphaned(self, grace: float) -> bool:
        """Block until no lifeline has been attached for ``grace`` seconds (True), or the
        command ended (False)."""
        with self._cond:
            while not self._ended:
                if self._stdin_attached or self._sockets:
                    self._cond.wait()
                    continue
                deadline = time.monotonic() + grace
                while not (self._stdin_attached or self._sockets or self._ended):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return True
                    self._cond.wait(left)
            return False

    def finish(self, status: int) -> None:
        """The command ended: tell every socket lifeline, flush, close."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()
            sinks = dict(self._sockets)
            stdout = self._stdout
        for sink in sinks:
            sink.put(encode_frame(KeeperExit(status)))
        for sink, conn in sinks.items():
            sink.close(5.0)
            with contextlib.suppress(OSError):
                conn.close()
        if stdout is not None:
            stdout.close(5.0)


def sweep_stale(directory: Path) -> None:
    """Remove sockets of keepers that are gone (SIGKILLed keepers cannot remove their own);
    the pid is the last part of the name."""
    for path in directory.glob("*-*.sock"):
        pid = path.stem.rpartition("-")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()


class LifelineServer:
    """The keeper's unix socket: each accepted connection is a lifeline."""

    def __init__(self, path: Path, lifelines: Lifelines) -> None:
        self.path = path
        sweep_stale(path.parent)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead keeper's, with our pid: pids are reused
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o077)
        try:
            self._sock.bind(str(path))
        finally:
            os.umask(old_mask)
        self._sock.listen(8)
        self._lifelines = lifelines
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            try:
                self._lifelines.attach(conn)
            except OSError:
                conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._sock.close()


def _stdout_write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def attach_relay(path: str) -> int:
    """``python -m dynamoctl.launch.keeper attach SOCK`` (an adopter's SSH channel): attach
    a lifeline and make it look like a fresh launch: the header as a JSON line, then the
    command's output on stdout, then its status as this process's exit status. Stdin
    closing (the channel gone) detaches."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        first = recv_frame(sock)
    except OSError as exc:
        print(f"[keeper attach] no keeper at {path}: {exc.strerror}", file=sys.stderr)
        return NO_KEEPER
    if not isinstance(first, KeeperHeader):
        print(f"[keeper attach] no keeper header at {path}", file=sys.stderr)
        return NO_KEEPER
    header = {"pid": first.pid, "pgid": first.pgid, "host": first.host, "socket": first.socket}
    _stdout_write(_json_line(header))

    def watch_stdin() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 65536):
                pass
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        while (message := recv_frame(sock)) is not None:
            if isinstance(message, KeeperExit):
                return message.status
            if isinstance(message, KeeperOutput):
                _stdout_write(message.data)
    except OSError:
        pass
    return 0  # detached (our channel closed) or the keeper was killed: nobody reads this


def _json_line(value: dict[str, object]) -> bytes:
    return (json.dumps(value) + "\n").encode()
