"""The keeper: runs one instance's command and makes sure nothing of it outlives its
supervisor.

    python -m dynamoctl.launch.keeper [--setsid] [--header] [--grace S] -- COMMAND...

Every launcher starts instances through it. The keeper

- optionally starts a new session (``--setsid``: its own process group, pgid = its pid),
  then runs COMMAND as a child in its group, stdout and stderr inherited;
- with ``--header``, first prints one JSON line ``{"pid", "pgid", "host"}`` so a remote
  launcher learns whom to signal;
- watches its stdin, a pipe (local) or SSH channel (ssh) held by the supervisor: at EOF
  the supervisor is gone, and the keeper stops the group (SIGTERM, ``--grace``, SIGKILL);
- survives the group-wide SIGTERM a launcher sends, so it can wait for COMMAND, then kill
  anything COMMAND left behind in the group (an engine's helper processes), and exit with
  COMMAND's status (128 + N when killed by signal N, as a shell reports it).

It imports only the standard library and psutil: it sits on every instance's start path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dynamoctl.launch.keeper")
    parser.add_argument("--setsid", action="store_true", help="start a new session first")
    parser.add_argument("--header", action="store_true", help="print pid/pgid/host as JSON")
    parser.add_argument("--grace", type=float, default=10.0, help="SIGTERM→SIGKILL seconds")
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
    """The supervisor is gone: SIGTERM the command, give it ``grace``, SIGKILL the rest."""
    for proc in [psutil.Process(child.pid), *_leftovers(pgid)]:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_leftovers(pgid)


def _watch_stdin(child: subprocess.Popen[bytes], pgid: int, grace: float) -> None:
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    if child.poll() is None:
        # stderr may be the very channel that just closed: saying so must not stop us.
        with contextlib.suppress(OSError):
            print("[keeper] supervisor gone (stdin closed): stopping the instance", file=sys.stderr)
        _stop_group(child, pgid, grace)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.setsid and os.getsid(0) != os.getpid():  # a session leader already leads a group
        os.setsid()
    pgid = os.getpgrp()
    if args.header:
        header = {"pid": os.getpid(), "pgid": pgid, "host": socket.gethostname()}
        print(json.dumps(header), flush=True)
    # A handler, not SIG_IGN: ignored signals would stay ignored in COMMAND after exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(args.command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"[keeper] cannot run {args.command[0]!r}: {exc}", file=sys.stderr)
        return 127
    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, args=(child, pgid, args.grace), daemon=True).start()
    code = child.wait()
    _kill_leftovers(pgid)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
