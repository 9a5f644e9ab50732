"""One suite, three launchers: the semantics ``dynamoctl/launch/api.py`` promises, checked
against the local launcher, the SSH launcher (a real sshd in a network namespace,
tests/launch/conftest.py) and the Slurm launcher (a real single-node cluster and an
allocation in it, tests/slurm/conftest.py).

- an instance runs in a process group of its own (under Slurm: a job step of its own);
- a signal reaches the whole group: a child the instance spawned gets it too;
- what it prints, stdout and stderr, lands in its log file;
- ``stop()`` is SIGTERM, grace, SIGKILL, and ends an instance that ignores SIGTERM;
- its :class:`ProcessRecord`, as ``state.json`` stores it, is enough for a fresh launcher
  object (``dynamoctl down`` after the supervisor died) to ``reap()`` it.

Every host here is this machine's kernel (namespaces share pids), so psutil sees the
instances' processes wherever they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import psutil
import pytest

from dynamoctl.launch.api import InstanceSpec, Launcher, ProcessRecord, SecretRef, stop
from dynamoctl.launch.local import LocalLauncher
from dynamoctl.launch.slurm.launcher import STEP_PREFIX, SlurmLauncher, list_steps
from tests.launch.test_ssh_launcher import launcher_for as ssh_launcher

# The instance: a child that reports SIGTERM, then itself; both ignore SIGTERM if "deaf".
CHILD = textwrap.dedent("""
    import signal, sys, time
    def term(*_):
        print("child got TERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1] == "deaf" else term)
    print("child up", flush=True)
    time.sleep(300)
""")
INSTANCE = textwrap.dedent("""
    import json, os, signal, socket, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]])
    def term(*_):
        print("parent got TERM", flush=True)
        child.wait()  # the child got the signal itself: nobody forwards it
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1] == "deaf" else term)
    info = {"pid": os.getpid(), "pgid": os.getpgrp(), "child": child.pid}
    print(json.dumps(info), flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    time.sleep(300)
""")


@dataclass
class Where:
    kind: str
    host: str
    make: Callable[[], Launcher]
    """A new launcher object: the supervisor's, or a later process's (``down``)."""
    env: dict[str, str]
    """Environment of Slurm's clients (empty otherwise)."""


@pytest.fixture(params=["local", "ssh", "slurm"])
def where(request: pytest.FixtureRequest) -> Where:
    kind: str = request.param
    if kind == "local":
        return Where(kind, "localhost", LocalLauncher, {})
    if kind == "ssh":
        hosts = request.getfixturevalue("ssh_hosts2")
        return Where(kind, hosts.names[1], lambda: ssh_launcher(hosts), {})
    cluster = request.getfixturevalue("slurm")
    job = request.getfixturevalue("allocation")
    return Where(
        kind, cluster.node, lambda: SlurmLauncher(job_id=job, env=cluster.env), cluster.env
    )


@pytest.fixture
async def launcher(where: Where) -> AsyncIterator[Launcher]:
    made = where.make()
    yield made
    await made.close()


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique argv word; whatever still carries it at the end is killed."""
    word = f"dyn-conformance-{uuid.uuid4().hex[:10]}"
    yield word
    for proc in _marked(word):
        proc.kill()


def _marked(word: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and word in (proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _spec(where: Where, marker: str, mode: str = "polite") -> InstanceSpec:
    argv = [sys.executable, "-c", INSTANCE, mode, CHILD, marker]
    return InstanceSpec(name="agg-0", pool="agg", component="worker", host=where.host, argv=argv)


async def _started(log: Path) -> dict[str, int]:
    """The instance's JSON line, once its child is up too."""
    await _until(lambda: "child up" in _text(log), f"the instance and its child up ({log})")
    line = next(ln for ln in _text(log).splitlines() if ln.startswith('{"pid"'))
    info: dict[str, int] = json.loads(line)
    return info


async def test_own_group_output_in_the_log_and_a_signal_reaches_the_child(
    where: Where, launcher: Launcher, tmp_path: Path, marker: str
) -> None:
    log = tmp_path / "logs" / "agg-0.log"
    proc = await launcher.start(_spec(where, marker), log)
    info = await _started(log)
    assert proc.record.launcher == where.kind and proc.record.host == where.host
    assert "a line on stderr" in _text(log)  # stderr too, in the same file

    # Its own process group, with its child in it, not ours.
    assert os.getpgid(info["child"]) == info["pgid"] != os.getpgrp()
    if where.kind == "slurm":  # a job step of its own, named after the instance
        step = proc.record.step
        assert step is not None
        assert (await list_steps(step.partition(".")[0], where.env))[step] == f"{STEP_PREFIX}agg-0"
    else:
        assert info["pgid"] == proc.record.pgid == proc.record.pid  # the keeper leads it

    await proc.signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 15) == 0  # the parent's handler ran
    assert "child got TERM" in _text(log) and "parent got TERM" in _text(log)
    await _until(lambda: not _alive(info["child"]), "the child gone")
    await _until(lambda: not _marked(marker), "nothing of the instance left")


async def test_stop_kills_an_instance_that_ignores_sigterm(
    where: Where, launcher: Launcher, tmp_path: Path, marker: str
) -> None:
    log = tmp_path / "deaf.log"
    proc = await launcher.start(_spec(where, marker, "deaf"), log)
    info = await _started(log)
    started = time.monotonic()
    code = await asyncio.wait_for(stop(proc, grace=1.0), 15)
    assert time.monotonic() - started >= 1.0  # SIGTERM alone did not end it
    assert code in (-signal.SIGKILL, 128 + signal.SIGKILL), code
    assert proc.returncode == code
    await _until(lambda: not _alive(info["pid"]) and not _alive(info["child"]), "all killed")
    await _until(lambda: not _marked(marker), "nothing of the instance left")


async def test_the_record_alone_reaps_from_a_fresh_launcher(
    where: Where, launcher: Launcher, tmp_path: Path, marker: str
) -> None:
    log = tmp_path / "reaped.log"
    proc = await launcher.start(_spec(where, marker), log)
    info = await _started(log)
    stored = msgspec.json.decode(msgspec.json.encode(proc.record), type=ProcessRecord)

    fresh = where.make()  # another object, as in another process: only the record
    try:
        assert await asyncio.wait_for(fresh.reap(stored, grace=5.0), 15) is True
        await _until(lambda: not _alive(info["pid"]) and not _alive(info["child"]), "reaped")
        await asyncio.wait_for(proc.wait(), 15)  # its own launcher sees it end
        assert await asyncio.wait_for(fresh.reap(stored, grace=1.0), 15) is False  # nothing left
    finally:
        await fresh.close()
    await _until(lambda: not _marked(marker), "nothing of the instance left")


# Prints a digest of its HF_TOKEN (never the value), then waits to be looked at.
SECRET_READER = textwrap.dedent("""
    import hashlib, os, sys, time
    token = os.environ.get("HF_TOKEN", "")
    print("token digest", hashlib.sha256(token.encode()).hexdigest(), flush=True)
    time.sleep(300)
""")


async def test_a_secret_reaches_the_environment_and_no_command_line(
    where: Where, launcher: Launcher, tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = f"hf_{uuid.uuid4().hex}"
    monkeypatch.setenv("DYN_TEST_TOKEN_SOURCE", value)  # read by the launcher, right now
    spec = msgspec.structs.replace(
        _spec(where, marker),
        argv=[sys.executable, "-c", SECRET_READER, marker],
        secrets={"HF_TOKEN": SecretRef(env="DYN_TEST_TOKEN_SOURCE")},
    )
    assert value not in " ".join(launcher.describe(spec))  # the dry run shows no value
    log = tmp_path / "secret.log"
    proc = await launcher.start(spec, log)
    digest = hashlib.sha256(value.encode()).hexdigest()
    await _until(lambda: "token digest" in _text(log), f"the command's digest line ({log})")
    assert f"token digest {digest}" in _text(log)  # the command saw the value
    # No process on this machine (keeper, srun, sshd, shells, the command) has it in argv.
    for other in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            assert value not in " ".join(other.info["cmdline"] or []), other
    assert value not in _text(log)
    await stop(proc, grace=5.0)
    await _until(lambda: not _marked(marker), "nothing of the instance left")
