"""The keeper: runs one instance's command, and stops it when no supervisor has held it
for ``--orphan-grace`` seconds.

    python -m dynamoctl.launch.keeper [--setsid] [--header] [--grace S] [--orphan-grace S]
        [--socket NAME] [--relay-output] [--env-stdin] -- COMMAND...
    python -m dynamoctl.launch.keeper attach SOCKET

Every launcher starts instances through it. The keeper

- optionally starts a new session (``--setsid``: its own process group, pgid = its pid),
  then runs COMMAND as a child in its group;
- with ``--env-stdin``, first reads one line from stdin, a JSON object of variables set in
  COMMAND's environment: how secrets reach a remote command without a command line;
- with ``--socket NAME``, listens on a unix socket in a directory private to the user
  (:func:`dynamoctl.launch.lifeline.socket_path`): each connection is a *lifeline*
  (:mod:`dynamoctl.wire.keeper`), how a new supervisor adopts the instance;
- with ``--header``, prints one JSON line ``{"pid", "pgid", "host", "socket"}`` so a remote
  launcher learns whom to signal and where to attach later;
- treats its stdin, a pipe (local) or SSH channel (ssh) held by the supervisor, as the
  first lifeline. When no lifeline is attached for ``--orphan-grace`` seconds (0: at
  once, the default) it stops the group (SIGTERM, ``--grace``, SIGKILL);
- with ``--relay-output`` (ssh), owns COMMAND's stdout and stderr (one pipe) and relays
  them to its own stdout and to attached lifelines, keeping a bounded tail while none is
  there: a closed channel never reaches COMMAND as EPIPE or SIGPIPE;
- survives the group-wide SIGTERM a launcher sends, so it can wait for COMMAND, then kill
  anything COMMAND left behind in the group (an engine's helper processes), tell its
  lifelines, and exit with COMMAND's status (128 + N when killed by signal N, as a shell
  reports it);
- on Linux, asks the kernel to send COMMAND SIGTERM if the keeper itself dies (SIGKILL,
  the OOM killer): an instance nobody can adopt any more must not run on unsupervised.

``attach SOCKET`` is the other end, for an adopter on another host: it attaches a lifeline
and turns it back into what a fresh launch looks like over SSH (header line, output,
exit status). See docs/architecture.md, "Keepers and lifelines".

It imports only the standard library, psutil and msgspec: it sits on every instance's
start path.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

import psutil

from dynamoctl.launch.lifeline import Lifelines, LifelineServer, attach_relay, socket_path
from dynamoctl.wire.keeper import KeeperHeader

ENV_LINE_MAX = 1 << 20
"""Longest ``--env-stdin`` line, in bytes."""


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dynamoctl.launch.keeper")
    parser.add_argument("--setsid", action="store_true", help="start a new session first")
    parser.add_argument("--header", action="store_true", help="print pid/pgid/host as JSON")
    parser.add_argument("--grace", type=float, default=10.0, help="SIGTERM→SIGKILL seconds")
    parser.add_argument(
        "--orphan-grace", type=float, default=0.0, help="seconds kept alive with no lifeline"
    )
    parser.add_argument("--socket", default="", help="listen for lifelines (a socket name)")
    parser.add_argument("--relay-output", action="store_true", help="own COMMAND's output")
    parser.add_argument("--env-stdin", action="store_true", help="read env JSON from stdin")
    parser.add_argument("--no-watch-stdin", dest="watch_stdin", action="store_false")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


def _leftovers(pgid: int) -> list[psutil.Process]:
    """Processes other than this one in ``pgid`` or below it."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    try:
        for child in psutil.Process(me).children(recursive=True):
            found[child.pid] = child
    except psutil.Error:
        pass
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and os.getpgid(proc.pid) == pgid:
                found[proc.pid] = proc
        except (OSError, psutil.Error):
            continue
    return list(found.values())


def _kill_leftovers(pgid: int) -> None:
    for proc in _leftovers(pgid):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _stop_group(child: subprocess.Popen[bytes], pgid: int, grace: float) -> None:
    """No supervisor: SIGTERM the command, give it ``grace``, SIGKILL the rest."""
    for proc in [psutil.Process(child.pid), *_leftovers(pgid)]:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_leftovers(pgid)


def _read_env_line() -> dict[str, str]:
    """The first line of stdin: a JSON object of environment variables (``--env-stdin``).
    Byte by byte, so that nothing after it is consumed: the rest of stdin is the lifeline."""
    line = bytearray()
    while len(line) < ENV_LINE_MAX:
        byte = os.read(0, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    env = json.loads(line or b"{}")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("--env-stdin: the first line is not a JSON object of strings")
    return env


def _watch_stdin(lifelines: Lifelines, orphan_grace: float) -> None:
    with contextlib.suppress(OSError):
        while os.read(0, 65536):
            pass
    lifelines.stdin_closed()
    if orphan_grace > 0 and not lifelines.attached():
        lifelines.say(f"supervisor gone (stdin closed): kept {orphan_grace:g} s for a new one")


def _watch_orphan(
    lifelines: Lifelines, child: subprocess.Popen[bytes], pgid: int, args: argparse.Namespace
) -> None:
    if lifelines.wait_orphaned(args.orphan_grace) and child.poll() is None:
        gone = f"no supervisor for {args.orphan_grace:g} s" if args.orphan_grace > 0 else ""
        lifelines.say(f"{gone or 'supervisor gone (stdin closed)'}: stopping the instance")
        _stop_group(child, pgid, args.grace)


def _relay(out: IO[bytes], lifelines: Lifelines) -> None:
    with contextlib.suppress(OSError):
        while chunk := os.read(out.fileno(), 65536):
            lifelines.output(chunk)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal() -> Callable[[], None] | None:
    """What the child runs before exec so the kernel SIGTERMs it when the keeper dies.

    Without it a SIGKILLed keeper leaves its command running with nobody to stop it (its
    lifeline socket is gone with the keeper, so no supervisor can adopt it). SIGTERM, not
    SIGKILL: the command drains and stops its own helper processes. None off Linux.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    keeper = os.getpid()

    def arm() -> None:  # in the child, between fork and exec: async-signal-safe calls only
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != keeper:  # the keeper died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _start(
    args: argparse.Namespace, env: dict[str, str], lifelines: Lifelines
) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            args.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if args.relay_output else None,
            stderr=subprocess.STDOUT if args.relay_output else None,
            env={**os.environ, **env} if env else None,
            preexec_fn=_parent_death_signal(),
        )
    except OSError as exc:
        lifelines.say(f"cannot run {args.command[0]!r}: {exc}")
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["attach"] and len(argv) == 2:
        return attach_relay(argv[1])
    args = _parse(argv)
    if args.setsid and os.getsid(0) != os.getpid():  # a session leader already leads a group
        os.setsid()
    pgid = os.getpgrp()
    env = _read_env_line() if args.env_stdin else {}
    path = socket_path(args.socket, os.getpid()) if args.socket else None
    header = KeeperHeader(os.getpid(), pgid, socket.gethostname(), str(path or ""))
    lifelines = Lifelines(header, relay_to_stdout=args.relay_output)
    server = LifelineServer(path, lifelines) if path is not None else None
    try:
        if args.header:
            fields = {"pid": header.pid, "pgid": pgid, "host": header.host, "socket": header.socket}
            print(json.dumps(fields), flush=True)
        # A handler, not SIG_IGN: ignored signals would stay ignored in COMMAND after exec.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        child = _start(args, env, lifelines)
        if child is None:
            lifelines.finish(127)
            return 127
        relay = None
        if child.stdout is not None:
            relay = threading.Thread(target=_relay, args=(child.stdout, lifelines), daemon=True)
            relay.start()
        if args.watch_stdin:
            watch = (lifelines, args.orphan_grace)
            threading.Thread(target=_watch_stdin, args=watch, daemon=True).start()
        orphan = (lifelines, child, pgid, args)
        threading.Thread(target=_watch_orphan, args=orphan, daemon=True).start()
        code = child.wait()
        _kill_leftovers(pgid)  # they may hold the output pipe open
        if relay is not None:
            relay.join(5.0)
        status = code if code >= 0 else 128 - code
        if server is not None:
            server.close()  # first: nobody may attach to an instance whose end they missed
        lifelines.finish(status)
        return status
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
