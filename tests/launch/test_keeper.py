"""The keeper's lifelines (docs/architecture.md, "Keepers and lifelines"): an instance
outlives a SIGKILLed supervisor for its orphan grace, a new lifeline takes it back, and
without one it is stopped; over SSH the keeper owns its command's output, so a dead
channel costs output, never the command. Real processes and signals throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from dynamoctl.launch.api import ProcessRecord
from dynamoctl.launch.lifeline import private_dir
from dynamoctl.launch.local import LocalLauncher

# A stand-in supervisor: launches one instance with the local launcher, prints its record,
# then waits to be killed (the instance's output goes to the log file given).
SUPERVISOR = textwrap.dedent("""
    import asyncio, sys, time, msgspec
    from pathlib import Path
    from dynamoctl.launch.api import InstanceSpec
    from dynamoctl.launch.local import LocalLauncher
    async def main():
        argv = [sys.executable, "-c", "import time; time.sleep(300)", sys.argv[3]]
        spec = InstanceSpec(name="agg-0", pool="agg", component="worker", host="localhost",
                            argv=argv)
        proc = await LocalLauncher(float(sys.argv[1])).start(spec, Path(sys.argv[2]))
        print(msgspec.json.encode(proc.record).decode(), flush=True)
        await asyncio.sleep(300)
    asyncio.run(main())
""")
# Prints a numbered line every 20 ms and records how far it got in the file it is given.
TICKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    for n in range(100000):
        print("tick", n, flush=True)
        Path(sys.argv[1]).write_text(str(n))
        time.sleep(0.02)
""")


def _group(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                alive.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return alive


def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[[float], tuple[ProcessRecord, Path]]]:
    """Start a stand-in supervisor with an orphan grace, SIGKILL it: the record and log."""
    marker = f"dyn-keeper-test-{os.getpid()}-{time.monotonic_ns()}"
    started: list[ProcessRecord] = []

    def run(grace: float) -> tuple[ProcessRecord, Path]:
        log = tmp_path / "agg-0.log"
        sup = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, str(grace), str(log), marker],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sup.stdout is not None
        record = ProcessRecord(**json.loads(sup.stdout.readline()))
        started.append(record)
        sup.kill()
        sup.wait()
        return record, log

    yield run
    for record in started:
        for pid in _group(record.pgid):
            psutil.Process(pid).kill()


def test_an_orphan_is_kept_for_its_grace_and_a_new_lifeline_takes_it_back(
    supervised: Callable[[float], tuple[ProcessRecord, Path]],
) -> None:
    record, log = supervised(30.0)
    assert record.socket.startswith(str(private_dir()))
    assert private_dir().stat().st_mode & 0o777 == 0o700
    _until(lambda: "supervisor gone (stdin closed): kept 30 s" in _text(log), "the keeper noticed")
    assert len(_group(record.pgid)) == 2  # keeper and command, still running

    async def adopt_then_stop() -> tuple[int, int | None]:
        adopted = await LocalLauncher(30.0).adopt(record, log)
        assert adopted is not None and adopted.record == record
        await asyncio.to_thread(_until, lambda: "lifeline attached" in _text(log), "attached")
        await adopted.signal(signal.SIGTERM)
        code = await asyncio.wait_for(adopted.wait(), 15)
        again = await LocalLauncher(30.0).adopt(record, log)  # nothing left to adopt
        return code, None if again is None else again.record.pid

    code, again = asyncio.run(adopt_then_stop())
    assert code == 128 + signal.SIGTERM  # the command's status, through the lifeline
    assert again is None
    _until(lambda: not _group(record.pgid), "the group gone")
    assert not Path(record.socket).exists()  # the keeper removed its socket


def test_with_no_lifeline_for_the_grace_the_instance_is_stopped(
    supervised: Callable[[float], tuple[ProcessRecord, Path]],
) -> None:
    record, log = supervised(1.0)
    _until(lambda: not _group(record.pgid), "the group stopped after the orphan grace")
    assert "[keeper] no supervisor for 1 s: stopping the instance" in _text(log)
    assert asyncio.run(LocalLauncher(1.0).adopt(record, log)) is None


def test_a_dead_channel_never_reaches_the_command_and_attach_gets_the_tail(
    tmp_path: Path,
) -> None:
    """As over SSH: the keeper owns the command's output. The channel (here: pipes) dies,
    the command keeps printing; ``keeper attach`` gets what was kept, then live output,
    then the command's exit status."""
    progress = tmp_path / "progress"
    keeper = subprocess.Popen(
        [sys.executable, "-m", "dynamoctl.launch.keeper", "--setsid", "--header",
         "--relay-output", "--env-stdin", "--orphan-grace", "30", "--socket", "agg-9",
         "--", sys.executable, "-c", TICKER, str(progress)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert keeper.stdin is not None and keeper.stdout is not None
    try:
        keeper.stdin.write(b'{"SOME_TOKEN": "x"}\n')
        keeper.stdin.flush()
        header = json.loads(keeper.stdout.readline())
        assert header["pid"] == header["pgid"] == keeper.pid
        assert keeper.stdout.readline().startswith(b"tick 0")
        keeper.stdout.close()  # the channel dies: the next writes would be EPIPE/SIGPIPE
        keeper.stdin.close()
        command = psutil.Process(keeper.pid).children()[0]
        _until(lambda: int(_text(progress) or 0) >= 30, "30 lines printed past the channel")
        assert command.is_running() and command.status() != psutil.STATUS_ZOMBIE

        attach = subprocess.Popen(
            [sys.executable, "-m", "dynamoctl.launch.keeper", "attach", header["socket"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert attach.stdout is not None
        assert json.loads(attach.stdout.readline()) == header  # as a fresh launch looks
        seen = [attach.stdout.readline() for _ in range(40)]
        assert any(b"supervisor gone (stdin closed): kept 30 s" in line for line in seen)
        ticks = [int(line.split()[1]) for line in seen if line.startswith(b"tick ")]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # in order, no gap
        assert ticks[0] <= 5  # the tail kept while detached starts near the beginning
        os.killpg(keeper.pid, signal.SIGTERM)
        attach.stdout.read()
        assert attach.wait(15) == 128 + signal.SIGTERM  # not SIGPIPE: TERM ended it
        assert keeper.wait(15) == 128 + signal.SIGTERM
    finally:
        for pid in _group(keeper.pid):
            psutil.Process(pid).kill()


def test_a_starting_keeper_removes_the_sockets_of_killed_keepers(
    supervised: Callable[[float], tuple[ProcessRecord, Path]],
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names a keeper that was SIGKILLed before it could clean up
    stale = private_dir() / f"agg-7-{gone.pid}.sock"
    stale.touch()
    record, _ = supervised(30.0)
    _until(lambda: Path(record.socket).exists(), "the new keeper listening")
    assert not stale.exists()


def test_a_sigkilled_keeper_takes_its_command_down_with_it(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"
    command = [sys.executable, "-c", TICKER, str(ticks)]
    keeper = subprocess.Popen(
        [sys.executable, "-m", "dynamoctl.launch.keeper", "--setsid", "--header", "--", *command],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        assert keeper.stdout is not None
        json.loads(keeper.stdout.readline())
        _until(ticks.exists, "the command ticking")
        pids = [p for p in _group(keeper.pid) if p != keeper.pid]
        assert len(pids) == 1
        keeper.kill()  # no chance to stop its group: the kernel must
        keeper.wait()
        _until(lambda: _zombie(pids[0]), "the command gone")
        stopped_at = ticks.read_text()
        time.sleep(0.3)
        assert ticks.read_text() == stopped_at  # not ticking on, unsupervised
    finally:
        for pid in _group(keeper.pid):
            psutil.Process(pid).kill()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
