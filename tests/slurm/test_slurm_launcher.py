"""The Slurm launcher against a real single-node Slurm cluster (no fakes).

Instances are ``python -c`` scripts carrying a unique marker in their argv, so a test can
tell, with psutil, whether anything of them is left (srun, keeper or the script itself).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import psutil
import pytest

from dynamoctl.launch.api import InstanceSpec, LaunchError, ProcessRecord, stop
from dynamoctl.launch.slurm.jobs import BATCH_SCRIPT, cancel, job_state, sbatch_args, submit
from dynamoctl.launch.slurm.launcher import STEP_PREFIX, SlurmLauncher, kill_strays, list_steps
from dynamoctl.launch.slurm.state import JobState
from dynamoctl.recipe.targets import SlurmTarget
from tests.infra.slurm_cluster import SlurmCluster
from tests.slurm.conftest import allocate, wait_job_state

REPO = Path(__file__).resolve().parents[2]
SLEEPER = "import sys, time; print('up', sys.argv[1], flush=True); time.sleep(600)"
TALKER = (
    "import sys, time; print('out', sys.argv[1], flush=True); "
    "print('err', sys.argv[1], file=sys.stderr, flush=True); time.sleep(600)"
)
DEAF = (  # ignores SIGTERM: only SIGKILL ends it
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('deaf', sys.argv[1], flush=True); time.sleep(600)"
)


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique argv word; whatever still carries it at the end is killed."""
    word = f"dyn-slurm-test-{uuid.uuid4().hex[:10]}"
    yield word
    for proc in _marked(word):
        proc.kill()


def _marked(word: str, name: str | None = None) -> list[psutil.Process]:
    """Live (not zombie) processes with ``word`` in their command line (after ``name``)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            argv = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or word not in argv:
                continue
            if name is None or argv[argv.index(word) - 1] == name:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _spec(name: str, host: str, code: str, marker: str, **kw: object) -> InstanceSpec:
    argv = [sys.executable, "-c", code, name, marker]
    return InstanceSpec(name=name, pool="p", component="worker", host=host, argv=argv, **kw)  # type: ignore[arg-type]


async def _until(check: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {what}")
        await asyncio.sleep(0.1)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _contains(path: Path, text: str) -> Callable[[], bool]:
    return lambda: text in _text(path)


async def _steps(slurm: SlurmCluster, job: str) -> dict[str, str]:
    return await list_steps(job, slurm.env)


async def _steps_end(slurm: SlurmCluster, job: str, steps: list[str | None]) -> None:
    """Wait (bounded) until none of ``steps`` is listed: srun may exit a moment before."""
    for _ in range(100):
        left = set(steps) & set(await _steps(slurm, job))
        if not left:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"steps {left} of job {job} still listed")


async def _nothing_left(
    slurm: SlurmCluster, job: str, steps: list[str | None], marker: str
) -> None:
    """``steps`` ended and no process carries ``marker`` any more."""
    await _steps_end(slurm, job, steps)
    await _until(lambda: not _marked(marker), what=f"no process left with {marker}")


async def test_steps_logs_and_stopping_one_leaves_the_other(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    specs = [_spec(name, slurm.node, TALKER, marker) for name in ("a", "b")]
    await launcher.preflight(specs)
    a, b = [await launcher.start(spec, tmp_path / f"{spec.name}.log") for spec in specs]
    try:
        assert a.record.launcher == "slurm" and a.record.host == slurm.node
        assert a.record.pgid == a.record.pid and a.record.step and b.record.step
        assert a.record.step.startswith(f"{allocation}.") and a.record.step != b.record.step
        steps = await _steps(slurm, allocation)
        assert steps[a.record.step] == f"{STEP_PREFIX}a"
        assert steps[b.record.step] == f"{STEP_PREFIX}b"

        for name in ("a", "b"):
            log = tmp_path / f"{name}.log"
            await _until(_contains(log, f"err {name}"), what=f"{name}'s output in {log}")
            assert f"out {name}" in _text(log)
        assert "out b" not in _text(tmp_path / "a.log")

        code = await stop(a, grace=15)
        assert code != 0 and a.returncode == code
        await _steps_end(slurm, allocation, [a.record.step])
        assert b.record.step in await _steps(slurm, allocation) and b.returncode is None
        await _until(lambda: not _marked(marker, "a"), what="nothing left of a")
        assert _marked(marker, "b")
    finally:
        await stop(b, grace=15)
    await _nothing_left(slurm, allocation, [b.record.step], marker)


async def test_exit_status_reaches_returncode(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    late = "import sys, time; time.sleep(1.5); sys.exit(3)"
    now = "import sys; sys.exit(3)"
    procs = [
        await launcher.start(_spec(name, slurm.node, code, marker), tmp_path / f"{name}.log")
        for name, code in (("late", late), ("now", now))
    ]
    codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 60)
    assert codes == [3, 3]
    assert procs[0].record.step is not None  # it ran long enough to be seen
    await _steps_end(slurm, allocation, [p.record.step for p in procs])
    assert set(await _steps(slurm, allocation)) == {f"{allocation}.batch"}


async def test_stop_kills_an_instance_that_ignores_sigterm(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    proc = await launcher.start(_spec("deaf", slurm.node, DEAF, marker), tmp_path / "deaf.log")
    await _until(lambda: "deaf" in _text(tmp_path / "deaf.log"), what="deaf started")
    started = time.monotonic()
    code = await asyncio.wait_for(stop(proc, grace=2), 60)
    assert code == 128 + signal.SIGKILL, _text(tmp_path / "deaf.log")
    assert time.monotonic() - started >= 2  # SIGTERM alone did not end it
    await _nothing_left(slurm, allocation, [proc.record.step], marker)


async def test_reap_from_a_record_alone(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    first = SlurmLauncher(job_id=allocation, env=slurm.env)
    proc = await first.start(_spec("r", slurm.node, SLEEPER, marker), tmp_path / "r.log")
    await _until(lambda: "up r" in _text(tmp_path / "r.log"), what="r started")
    record = msgspec.json.decode(msgspec.json.encode(proc.record), type=ProcessRecord)

    other = SlurmLauncher(job_id=None, env=slurm.env)  # like `dynamoctl down`, from outside
    assert await other.reap(record, grace=10) is True
    assert record.step not in await _steps(slurm, allocation)  # reap waited for that
    assert await asyncio.wait_for(proc.wait(), 30) != 0  # srun followed its step
    assert await other.reap(record, grace=10) is False
    await _until(lambda: not _marked(marker), what=f"no process left with {marker}")


async def test_start_that_times_out_leaves_nothing(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env, step_timeout=0)
    with pytest.raises(LaunchError, match=r"slow: no job step on .* after 0 s"):
        await launcher.start(_spec("slow", slurm.node, SLEEPER, marker), tmp_path / "s.log")
    await _until(lambda: not _marked(marker), what=f"no process left with {marker}")
    await _steps_end(
        slurm, allocation, [s for s in await _steps(slurm, allocation) if not s.endswith(".batch")]
    )


async def test_a_step_whose_srun_is_killed_alone_is_killed_too(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    """SIGKILL to srun alone (the OOM killer) leaves its step's tasks running, with the
    keeper's stdin never closing; the instance's end must take the step with it, or its
    restart finds the GPUs and ports still held."""
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    proc = await launcher.start(_spec("lone", slurm.node, SLEEPER, marker), tmp_path / "l.log")
    await _until(lambda: "up lone" in _text(tmp_path / "l.log"), what="lone is up")
    os.killpg(proc.record.pgid, signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    await _nothing_left(slurm, allocation, [proc.record.step], marker)


async def test_kill_strays_ends_a_step_that_lost_its_srun(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    """What a timed-out start does once srun is gone: the steps of that name it made die."""
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    name = f"{STEP_PREFIX}stray"
    before = set(await _steps(slurm, allocation))
    with (tmp_path / "s.log").open("wb") as out:
        srun = await asyncio.create_subprocess_exec(
            *launcher.describe(_spec("stray", slurm.node, SLEEPER, marker)),
            stdin=asyncio.subprocess.PIPE,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=slurm.env,
            start_new_session=True,
        )
    try:
        await _until(lambda: "up stray" in _text(tmp_path / "s.log"), what="stray is up")
        os.killpg(srun.pid, signal.SIGKILL)
        await asyncio.wait_for(srun.wait(), 10)
        await kill_strays(allocation, f"{STEP_PREFIX}other", before, slurm.env)  # not its name
        assert _marked(marker, "stray")
        await kill_strays(allocation, name, before, slurm.env)
        named: list[str | None] = [
            s for s, n in (await _steps(slurm, allocation)).items() if n == name
        ]
        await _nothing_left(slurm, allocation, named, marker)
    finally:
        if srun.returncode is None:
            srun.kill()


async def test_preflight_names_a_host_outside_the_allocation(
    slurm: SlurmCluster, allocation: str, marker: str
) -> None:
    launcher = SlurmLauncher(job_id=allocation, env=slurm.env)
    await launcher.preflight([_spec("ok", slurm.node, SLEEPER, marker)])
    with pytest.raises(LaunchError, match=r"far: host 'gpu-node-17' is not a node of Slurm job"):
        await launcher.preflight([_spec("far", "gpu-node-17", SLEEPER, marker)])
    with pytest.raises(LaunchError, match="not inside a Slurm allocation"):
        await SlurmLauncher(job_id=None, env=slurm.env).preflight([])


async def test_gpu_pinning_survives_slurms_own_cuda_visible_devices(
    slurm: SlurmCluster, tmp_path: Path, marker: str
) -> None:
    show = "import os, sys; print('cvd', sys.argv[1], os.environ.get('CUDA_VISIBLE_DEVICES'))"
    with allocate(slurm, tmp_path / "job.out", f"--gpus-per-node={slurm.gpus}") as job:
        launcher = SlurmLauncher(job_id=job, env=slurm.env)
        specs = [
            _spec("pinned", slurm.node, show, marker, gpus=[1]),
            _spec("byenv", slurm.node, show, marker, env={"CUDA_VISIBLE_DEVICES": "0"}),
            _spec("unpinned", slurm.node, show, marker),
        ]
        procs = [await launcher.start(s, tmp_path / f"{s.name}.log") for s in specs]
        assert await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 60) == [0] * 3
    assert "cvd pinned 1" in _text(tmp_path / "pinned.log")
    assert "cvd byenv 0\n" in _text(tmp_path / "byenv.log")
    assert "cvd unpinned 0,1" in _text(tmp_path / "unpinned.log")  # what Slurm sets itself


def _supervisor(records: Path, logs: Path, marker: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "tests/slurm/supervisor.py"),
        str(records),
        str(logs),
        marker,
    ]


async def _records(path: Path, timeout: float = 60) -> dict[str, ProcessRecord]:
    await _until(path.exists, timeout, what=f"the supervisor wrote {path}")
    return msgspec.json.decode(_text(path), type=dict[str, ProcessRecord])


async def test_batch_job_supervisor_and_scancel_of_the_job_ends_every_step(
    slurm: SlurmCluster, tmp_path: Path, marker: str
) -> None:
    """The real path: a batch script runs the supervisor, whose environment carries the
    allocation's variables (plus some that would break a nested srun if not stripped)."""
    records = tmp_path / "records.json"
    script = tmp_path / "job.sh"
    poison = "SRUN_CPUS_PER_TASK=64 SLURM_MEM_PER_NODE=99999 SLURM_GPUS_PER_NODE=9"
    poison += " SLURM_EXPORT_ENV=NONE SLURM_STDOUTMODE=/dev/null SLURM_NTASKS_PER_NODE=4"
    command = shlex.join(_supervisor(records, tmp_path, marker))
    script.write_text(f"#!/bin/bash\nexport {poison}\nexec {command}\n")
    job = await submit(
        SlurmTarget(
            kind="slurm",
            partition=slurm.partition,
            gpus_per_node=0,
            time_limit="0:10:00",
            extra_sbatch_args=[f"--chdir={REPO}"],
        ),
        script,
        job_name="dyn-supervisor",
        output=tmp_path / "job.out",
        drain_timeout=5,
        env=slurm.env,
    )
    try:
        found = await _records(records)
        steps = await _steps(slurm, job)
        for name in ("a", "b"):
            step = found[name].step
            assert step and steps[step] == f"{STEP_PREFIX}{name}", (
                steps,
                _text(tmp_path / "job.out"),
            )
            log = tmp_path / f"{name}.log"
            await _until(_contains(log, f"to stderr from {name}"), what=f"{name} output")
            assert f"hello from {name}" in _text(log)
        assert len(_marked(marker)) >= 2 * 3  # per instance: srun (+ its helper), keeper, script
    finally:
        await cancel(job, slurm.env)
    await _until(lambda: not _marked(marker), 60, what=f"no process left with {marker}")
    for _ in range(150):  # COMPLETING for a moment after its processes are gone
        state = await job_state(job, slurm.env)
        if state is not JobState.COMPLETING:
            break
        await asyncio.sleep(0.2)
    assert state in (None, JobState.CANCELLED), state
    assert await _steps(slurm, job) == {}


async def test_instances_stop_when_their_supervisor_dies(
    slurm: SlurmCluster, allocation: str, tmp_path: Path, marker: str
) -> None:
    """The keeper's stdin, forwarded by srun from the supervisor's pipe, is the lifeline."""
    records = tmp_path / "records.json"
    env = {**slurm.env, "SLURM_JOB_ID": allocation}
    with open(tmp_path / "supervisor.log", "wb") as out:  # noqa: ASYNC230
        supervisor = subprocess.Popen(  # noqa: ASYNC220 - killed with SIGKILL below
            _supervisor(records, tmp_path, marker), env=env, stdout=out, stderr=out, cwd=REPO
        )
    try:
        found = await _records(records)
        assert {r.step for r in found.values()} <= set(await _steps(slurm, allocation))
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(10)
        await _until(lambda: not _marked(marker), 60, what=f"no process left with {marker}")
        left = set(await _steps(slurm, allocation))
        assert not {r.step for r in found.values()} & left
        assert await job_state(allocation, slurm.env) is JobState.RUNNING  # the job goes on
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(10)


async def test_submit_and_cancel_round_trip(slurm: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\necho "args: $*"\nsleep 600\n')
    target = SlurmTarget(
        kind="slurm",
        partition=slurm.partition,
        gpus_per_node=1,
        time_limit="00:07:00",
        extra_sbatch_args=["--comment=dyn-roundtrip"],
    )
    out = tmp_path / "job.out"
    job = await submit(
        target, script, ["x", "y z"], job_name="dyn-rt", output=out, drain_timeout=45, env=slurm.env
    )
    try:
        await _until(lambda: "args: x y z" in _text(out), 60, what="the batch script ran")
        assert await job_state(job, slurm.env) is JobState.RUNNING
        shown = slurm.run("scontrol", "show", "job", "-o", job)
        for expected in ("JobName=dyn-rt", "TimeLimit=00:07:00", "Comment=dyn-roundtrip"):
            assert expected in shown
        print("SHOWN", shown)
        assert "gpu:1" in shown
    finally:
        await cancel(job, slurm.env)
    wait_job_state(slurm, job, {""})
    assert await job_state(job, slurm.env) in (None, "CANCELLED")
    await cancel(job, slurm.env)  # already gone: no error
    assert await job_state("999999", slurm.env) is None


def test_sbatch_args_follow_the_target(tmp_path: Path) -> None:
    target = SlurmTarget(
        kind="slurm",
        partition="gpu",
        account="proj",
        nodes=2,
        gpus_per_node=8,
        time_limit="1-00:00:00",
        extra_sbatch_args=["--exclusive"],
    )
    args = sbatch_args(target, job_name="d", output=tmp_path / "o", drain_timeout=45)
    assert args == [
        "--job-name=d",
        f"--output={tmp_path / 'o'}",
        "--nodes=2",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--signal=B:TERM@120",
        "--account=proj",
        "--time=1-00:00:00",
        "--exclusive",
    ]
    cpu_only = SlurmTarget(kind="slurm", partition="cpu", gpus_per_node=0)
    assert not any(
        a.startswith(("--gpus", "--account", "--time"))
        for a in sbatch_args(cpu_only, job_name="d", output=tmp_path / "o", drain_timeout=45)
    )
    # A long drain gets its time before the limit, plus a minute for the rest of the stop.
    long_drain = sbatch_args(target, job_name="d", output=tmp_path / "o", drain_timeout=300.5)
    assert "--signal=B:TERM@361" in long_drain


def test_slurm_job_states_are_classified() -> None:
    ended = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
    ended |= {"BOOT_FAIL", "DEADLINE", "PREEMPTED"}
    for name in ended:
        assert JobState(name).ended and not JobState(name).active, name
    for name in ("PENDING", "REQUEUED", "REQUEUE_HOLD"):
        assert JobState(name).queued and not JobState(name).ended, name
    for name in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
        assert JobState(name).active, name
    assert JobState("SOMETHING_NEW") is JobState.UNKNOWN and JobState.UNKNOWN.active
    # The batch script's own drain signal matches the default the login-node path uses.
    assert "#SBATCH --signal=B:TERM@120" in BATCH_SCRIPT.read_text()
    assert (REPO / "slurm" / "launch.sh").resolve() == BATCH_SCRIPT.resolve()


def test_describe_is_the_srun_command_line() -> None:
    spec = InstanceSpec(
        name="agg-0",
        pool="agg",
        component="worker",
        host="n1",
        argv=["dynamoctl", "worker"],
        env={"A": "1"},
        gpus=[2, 3],
    )
    launcher = SlurmLauncher(job_id="42", python="/opt/py", env={"PATH": "/usr/bin"})
    argv = launcher.describe(spec)
    assert argv == launcher.describe(spec)
    assert argv[:9] == [
        "srun",
        "--jobid=42",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n1",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--job-name=dynamoctl:agg-0",
    ]
    assert argv[9:] == [
        "env",
        "A=1",
        "CUDA_VISIBLE_DEVICES=2,3",
        "/opt/py",
        "-m",
        "dynamoctl.launch.keeper",
        "--",
        "dynamoctl",
        "worker",
    ]
