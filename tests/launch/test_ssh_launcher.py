"""The ssh launcher against real sshds, one per network namespace (see tests/infra/ssh_hosts).

Hosts are reached by name (``SshHosts.names``, in /etc/hosts and known_hosts), as in a
recipe; one test reaches a host by its address.

Namespaces share pids with this process, so the tests watch "remote" processes with psutil.
PID 1 here reaps orphans late: a killed process counts as gone once it is a zombie.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest

from dynamoctl.launch.api import InstanceSpec, LaunchError, ProcessRecord, stop
from dynamoctl.launch.ssh import SshLauncher, from_recipe
from dynamoctl.recipe.loader import load_recipe
from tests.infra.ssh_hosts import SshHosts, keygen

PY = sys.executable
# Prints where it runs (JSON), leaves a grandchild in its group, writes to stderr, sleeps.
SLEEPER = textwrap.dedent("""
    import json, os, socket, subprocess, sys, time
    child = subprocess.Popen(["sleep", "300"])
    info = {"host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid(),
            "pgid": os.getpgrp(), "child": child.pid}
    print(json.dumps(info), flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    time.sleep(300)
""")


def spec(
    host: str, argv: list[str], name: str = "agg-0", ports: dict[str, int] | None = None
) -> InstanceSpec:
    return InstanceSpec(
        name=name, pool="agg", component="worker", host=host, argv=argv, ports=ports or {}
    )


def launcher_for(hosts: SshHosts, **overrides: object) -> SshLauncher:
    options: dict[str, object] = {
        "user": hosts.user,
        "port": hosts.port,
        "key": hosts.key,
        "python": PY,
        "known_hosts": hosts.known_hosts,
        "connect_timeout": 5.0,
    }
    options.update(overrides)
    return SshLauncher(**options)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


async def instance_info(log: Path, timeout: float = 20) -> dict[str, int | str]:
    """The SLEEPER's JSON line, once it is in the log."""

    def line() -> str | None:
        text = log.read_text() if log.exists() else ""
        return next((ln for ln in text.splitlines() if ln.startswith('{"host"')), None)

    await until(lambda: line() is not None, timeout, f"the instance's line in {log}")
    info: dict[str, int | str] = json.loads(line() or "")
    return info


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups a test started; SIGKILLed at teardown if a test failed half-way."""
    pgids: list[int] = []
    yield pgids
    for pgid in pgids:
        if group(pgid):
            os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
async def launcher(ssh_hosts2: SshHosts) -> AsyncIterator[SshLauncher]:
    ssh = launcher_for(ssh_hosts2)
    yield ssh
    await ssh.close()


async def test_start_on_host_streams_output_and_stop_ends_the_group(
    ssh_hosts2: SshHosts, launcher: SshLauncher, tmp_path: Path, groups: list[int]
) -> None:
    host = ssh_hosts2.names[1]
    log = tmp_path / "logs" / "agg-0.log"
    proc = await launcher.start(spec(host, [PY, "-c", SLEEPER]), log)
    groups.append(proc.record.pgid)
    assert proc.record.launcher == "ssh" and proc.record.host == host
    assert proc.record.pid == proc.record.pgid
    assert "dynamoctl.launch.keeper" in " ".join(psutil.Process(proc.record.pid).cmdline())

    info = await instance_info(log)
    assert info["host"] == ssh_hosts2.names[1]  # ran in host 2's namespace
    assert info["ppid"] == proc.record.pid and info["pgid"] == proc.record.pgid
    await until(lambda: "a line on stderr" in log.read_text(), 10, "stderr in the log")
    grandchild = int(info["child"])
    assert alive(grandchild) and proc.returncode is None

    code = await stop(proc, grace=10)
    assert code == 128 + signal.SIGTERM  # the keeper reports its command's signal
    assert proc.returncode == code
    await until(lambda: not alive(grandchild), 10, "the grandchild gone")
    await until(lambda: not group(proc.record.pgid), 10, "the whole group gone")


async def test_exit_status_is_the_instances_and_it_runs_in_workdir(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    ssh = launcher_for(ssh_hosts2, workdir=str(workdir))
    try:
        argv = [PY, "-c", "import os, sys; print('cwd', os.getcwd(), flush=True); sys.exit(3)"]
        await ssh.preflight([spec(ssh_hosts2.names[0], argv)])
        proc = await ssh.start(spec(ssh_hosts2.names[0], argv), tmp_path / "x.log")
        assert await asyncio.wait_for(proc.wait(), 30) == 3
        assert proc.returncode == 3
        assert f"cwd {workdir}\n" in (tmp_path / "x.log").read_text()
    finally:
        await ssh.close()


async def test_a_host_given_by_its_address(ssh_hosts2: SshHosts, tmp_path: Path) -> None:
    """Names are what recipes use; an address (known_hosts lists both) works as well."""
    address = ssh_hosts2.addresses[1]
    ssh = launcher_for(ssh_hosts2)
    try:
        argv = [PY, "-c", "import socket; print('on', socket.gethostname(), flush=True)"]
        await ssh.preflight([spec(address, argv)])
        proc = await ssh.start(spec(address, argv), tmp_path / "x.log")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.record.host == address
        assert f"on {ssh_hosts2.names[1]}\n" in (tmp_path / "x.log").read_text()
    finally:
        await ssh.close()


async def test_a_killed_keeper_reports_minus_the_signal(
    launcher: SshLauncher, ssh_hosts2: SshHosts, tmp_path: Path, groups: list[int]
) -> None:
    """SIGTERM ignored → SIGKILL after grace kills the keeper too: -9, as the local one."""
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    script += "print('up', flush=True); time.sleep(300)"
    log = tmp_path / "x.log"
    proc = await launcher.start(spec(ssh_hosts2.names[0], [PY, "-c", script]), log)
    groups.append(proc.record.pgid)
    await until(lambda: "up" in log.read_text(), 20, "the instance up")
    assert await stop(proc, grace=1) == -signal.SIGKILL
    await until(lambda: not group(proc.record.pgid), 10, "the whole group gone")


SUPERVISOR = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from dynamoctl.launch.api import InstanceSpec
    from dynamoctl.launch.ssh import SshLauncher

    async def main(cfg):
        ssh = SshLauncher(user=cfg["user"], key=cfg["key"], known_hosts=cfg["known_hosts"],
                          python=sys.executable)
        spec = InstanceSpec(name="agg-0", pool="agg", component="worker", host=cfg["host"],
                            argv=[sys.executable, "-c", cfg["script"]])
        proc = await ssh.start(spec, Path(cfg["log"]))
        print(json.dumps({"pid": proc.record.pid, "pgid": proc.record.pgid}), flush=True)
        await asyncio.sleep(300)

    asyncio.run(main(json.loads(sys.argv[1])))
""")


async def test_supervisor_killed_the_keeper_stops_the_remote_group(
    ssh_hosts2: SshHosts, tmp_path: Path, groups: list[int]
) -> None:
    log = tmp_path / "agg-0.log"
    cfg = {
        "user": ssh_hosts2.user,
        "key": str(ssh_hosts2.key),
        "known_hosts": str(ssh_hosts2.known_hosts),
        "host": ssh_hosts2.names[1],
        "script": SLEEPER,
        "log": str(log),
    }
    supervisor = await asyncio.create_subprocess_exec(
        PY, "-c", SUPERVISOR, json.dumps(cfg), stdout=asyncio.subprocess.PIPE
    )
    try:
        record = json.loads(await asyncio.wait_for(supervisor.stdout.readline(), 30))  # type: ignore[union-attr]
        groups.append(record["pgid"])
        info = await instance_info(log)
        members = [record["pid"], int(info["pid"]), int(info["child"])]
        assert all(alive(pid) for pid in members)
        supervisor.kill()  # SIGKILL: no cleanup of its own; only the connection drops
        await supervisor.wait()
        await until(lambda: not group(record["pgid"]), 15, "the remote group gone")
        assert not any(alive(pid) for pid in members)
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()


async def test_close_stops_what_it_started(
    ssh_hosts2: SshHosts, tmp_path: Path, groups: list[int]
) -> None:
    ssh = launcher_for(ssh_hosts2)
    try:
        proc = await ssh.start(spec(ssh_hosts2.names[0], [PY, "-c", SLEEPER]), tmp_path / "l")
        groups.append(proc.record.pgid)
        await instance_info(tmp_path / "l")
    finally:
        await ssh.close()
    assert await asyncio.wait_for(proc.wait(), 15) is not None
    await until(lambda: not group(proc.record.pgid), 15, "the remote group gone")


async def test_reap_from_a_fresh_launcher(
    ssh_hosts2: SshHosts, launcher: SshLauncher, tmp_path: Path, groups: list[int]
) -> None:
    host = ssh_hosts2.names[1]
    proc = await launcher.start(spec(host, [PY, "-c", SLEEPER]), tmp_path / "a.log")
    groups.append(proc.record.pgid)
    info = await instance_info(tmp_path / "a.log")
    # As `dynamoctl down` would have it: from the run directory, in another process.
    record = ProcessRecord(launcher="ssh", host=host, pid=proc.record.pid, pgid=proc.record.pgid)
    fresh = launcher_for(ssh_hosts2)
    victim = await asyncio.create_subprocess_exec("sleep", "300", start_new_session=True)
    try:
        assert await fresh.reap(record, grace=5) is True
        await until(lambda: not group(record.pgid), 10, "the reaped group gone")
        assert not alive(int(info["child"]))
        assert await asyncio.wait_for(proc.wait(), 15) == 128 + signal.SIGTERM

        assert await fresh.reap(record, grace=5) is False  # nothing left

        # A pid that is no keeper (recycled): left alone.
        stranger = ProcessRecord(launcher="ssh", host=host, pid=victim.pid, pgid=victim.pid)
        assert await fresh.reap(stranger, grace=1) is False
        assert victim.returncode is None and alive(victim.pid)
    finally:
        victim.kill()
        await victim.wait()
        await fresh.close()


async def test_more_instances_than_sessions_per_connection(
    ssh_hosts2: SshHosts, launcher: SshLauncher, tmp_path: Path, groups: list[int]
) -> None:
    """The hosts' sshd allows 4 sessions per connection; 6 instances (and the signal
    channels to stop them) need a second connection."""
    host = ssh_hosts2.names[0]
    argv = [PY, "-c", "import time; print('up', flush=True); time.sleep(300)"]
    procs = []
    for i in range(6):
        procs.append(await launcher.start(spec(host, argv, f"agg-{i}"), tmp_path / f"{i}.log"))
        groups.append(procs[-1].record.pgid)
    assert len({p.record.pgid for p in procs}) == 6
    assert all(alive(p.record.pid) for p in procs)
    codes = await asyncio.gather(*(stop(p, grace=10) for p in procs))
    assert codes == [128 + signal.SIGTERM] * 6


async def test_a_command_that_cannot_run_ends_with_127(
    launcher: SshLauncher, ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    """As with the local launcher: the keeper starts, its command does not."""
    log = tmp_path / "x.log"
    proc = await launcher.start(spec(ssh_hosts2.names[0], ["/nonexistent/engine"]), log)
    assert await asyncio.wait_for(proc.wait(), 30) == 127
    assert "cannot run '/nonexistent/engine'" in log.read_text()  # the keeper says so


async def test_start_failure_names_instance_host_and_interpreter(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    host = ssh_hosts2.names[0]
    ssh = launcher_for(ssh_hosts2, python="/nonexistent/py")
    try:
        with pytest.raises(LaunchError, match=rf"agg-0: cannot start /nonexistent/py .* on {host}"):
            await ssh.start(spec(host, ["true"]), tmp_path / "x.log")
    finally:
        await ssh.close()


# --- preflight ----------------------------------------------------------------------------


async def test_preflight_passes_and_checks_ports_on_the_host(
    ssh_hosts2: SshHosts, launcher: SshLauncher
) -> None:
    port = 18123
    a, b = ssh_hosts2.names
    instances = [
        spec(a, [PY, "-m", "x", "--port", str(port)], "frontend-0", {"http": port}),
        spec(b, [PY, "-m", "x", "--http-port", str(port)], "agg-0", {"http": port}),
    ]
    await launcher.preflight(instances)
    # The port is taken on host 1 only: namespaces have their own ports.
    listen = f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); "
    listen += "s.listen(); print('ready', flush=True); time.sleep(120)"
    listener = await asyncio.create_subprocess_exec(
        *ssh_hosts2.netns_exec(0), PY, "-c", listen, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert listener.stdout is not None
        assert await asyncio.wait_for(listener.stdout.readline(), 20) == b"ready\n"
        busy = rf"frontend-0: port {port} \(http\) on {a} is already in use"
        with pytest.raises(LaunchError, match=busy):
            await launcher.preflight(instances)
        await launcher.preflight(instances[1:])
    finally:
        listener.kill()
        await listener.wait()


async def test_preflight_unreachable_host_is_bounded(ssh_hosts2: SshHosts) -> None:
    ssh = launcher_for(ssh_hosts2, connect_timeout=2.0)
    host = ssh_hosts2.unused_address
    started = time.monotonic()
    with pytest.raises(LaunchError, match=rf"ssh {host}:22: (timed out after 2 s|no route)"):
        await ssh.preflight([spec(host, ["true"])])
    assert time.monotonic() - started < 10
    await ssh.close()


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        ({"port": 2}, r"ssh {host}:2: connection refused"),
        ({"key": "WRONG"}, r"ssh {host}:22: permission denied \(publickey\) for user root"),
        ({"known_hosts": "EMPTY"}, r"ssh {host}:22: host key not verifiable"),
        ({"python": "/usr/bin/false"}, r"ssh {host}: /usr/bin/false cannot import dynamoctl"),
        ({"python": "/nonexistent/py"}, r"ssh {host}: /nonexistent/py cannot .*No such file"),
        ({"workdir": "/nonexistent/dir"}, r"ssh {host}: workdir /nonexistent/dir: No such"),
    ],
    ids=["refused", "wrong-key", "unknown-host-key", "python-false", "no-python", "no-workdir"],
)
async def test_preflight_errors_name_host_and_cause(
    ssh_hosts2: SshHosts, tmp_path: Path, overrides: dict[str, object], cause: str
) -> None:
    if overrides.get("key") == "WRONG":
        overrides = {"key": keygen(tmp_path / "other_key")}
    if overrides.get("known_hosts") == "EMPTY":
        overrides = {"known_hosts": tmp_path / "no_known_hosts"}
    first, second = ssh_hosts2.names  # both fail: the first in instance order is named
    ssh = launcher_for(ssh_hosts2, **overrides)
    try:
        with pytest.raises(LaunchError, match=cause.format(host=first)):
            await ssh.preflight([spec(first, ["true"]), spec(second, ["true"], "agg-1")])
    finally:
        await ssh.close()


def test_describe_is_the_ssh_command_line() -> None:
    ssh = SshLauncher(
        user="svc",
        port=2222,
        key="/keys/id",
        python="/venv/bin/python",
        workdir="~/run",
        known_hosts=None,
    )
    instance = InstanceSpec(
        name="agg-0",
        pool="agg",
        component="worker",
        host="gpu1",
        argv=["dynamoctl", "worker", "--model", "a b"],
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
    )
    remote = (
        "cd run && exec env CUDA_VISIBLE_DEVICES=0,1 /venv/bin/python -m dynamoctl.launch.keeper"
        " --header --relay-output --env-stdin -- dynamoctl worker --model 'a b'"
    )
    assert ssh.describe(instance) == [
        "ssh", "-p", "2222", "-i", "/keys/id", "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "svc@gpu1", remote,
    ]  # fmt: skip
    assert ssh.describe(instance) == ssh.describe(instance)


def test_from_recipe_takes_the_ssh_target() -> None:
    recipe = load_recipe(Path(__file__).parents[2] / "recipes" / "vllm-agg.yaml")
    ssh = from_recipe(recipe)
    argv = ssh.describe(spec("gpu-node-1", ["dynamoctl", "worker"]))
    key = str(Path("~/.ssh/id_ed25519").expanduser())
    assert argv[:6] == ["ssh", "-p", "22", "-i", key, "serving@gpu-node-1"]
    assert argv[6] == (
        "cd /var/lib/dynamoctl && exec /opt/dynamoctl/venv/bin/python -m dynamoctl.launch.keeper"
        " --header --relay-output --env-stdin --orphan-grace 60 --socket agg-0 -- dynamoctl worker"
    )
