"""The mocker's multi-node replica with real follower processes (``dynamoctl follower``)
on loopback: every step is a round trip with each follower, so a stopped follower stalls
the leader, a dead one ends its engine past ``collective_timeout``, followers leave when
the leader does, and joining is bounded on both sides."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from dynamoctl.engines.api import EngineDied, GenerateRequest
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.engine import MockerEngine
from dynamoctl.engines.mocker.gang import GangError
from tests.infra.ports import free_port

pytestmark = pytest.mark.gang


def follower(
    port: int, rank: int = 1, nnodes: int = 2, timeout: float = 30
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dynamoctl", "follower", "--engine", "mocker"]
    argv += ["--label", f"agg-0.{rank}", "--rendezvous", f"127.0.0.1:{port}"]
    argv += ["--rendezvous-timeout", str(timeout), "--"]
    argv += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)


def started_follower(port: int, rank: int = 1, nnodes: int = 2) -> subprocess.Popen[str]:
    """A follower, returned once it runs and polls the rendezvous: a plain listener on the
    port takes its first probe (it closes first, leaving no TIME_WAIT here), then goes.
    Its python start-up can take longer on a loaded machine than the short join timeouts
    these tests give the leader."""
    with socket.create_server(("127.0.0.1", port)) as probe:
        probe.settimeout(60)
        proc = follower(port, rank, nnodes)
        conn, _ = probe.accept()
        with conn:
            conn.settimeout(60)
            conn.recv(1)  # b"": the follower closed its probe
    return proc


@pytest.fixture
async def gang() -> AsyncIterator[tuple[MockerEngine, list[subprocess.Popen[str]]]]:
    port = free_port()
    config = MockerConfig(
        nnodes=3, master_port=port, collective_timeout=20, speedup_ratio=50, num_gpu_blocks=512
    )
    engine = MockerEngine(config)
    members = [follower(port, rank, nnodes=3) for rank in (1, 2)]
    try:
        await engine.start()
        yield engine, members
    finally:
        await engine.stop()
        for proc in members:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


async def _tokens(engine: MockerEngine, rid: str, count: int) -> int:
    got = 0
    async for chunk in engine.generate(GenerateRequest(rid, list(range(40)), count)):
        got += len(chunk.token_ids)
    return got


async def test_steps_need_every_follower_and_a_stopped_one_stalls_the_leader(
    gang: tuple[MockerEngine, list[subprocess.Popen[str]]],
) -> None:
    engine, members = gang
    assert await _tokens(engine, "a", 8) == 8
    steps = engine.stats.steps
    os.kill(members[1].pid, signal.SIGSTOP)  # as a GPU hung in a collective
    stalled = asyncio.create_task(_tokens(engine, "b", 8))
    done, _ = await asyncio.wait({stalled}, timeout=2)
    assert not done  # no step can finish without rank 2's answer
    assert engine.stats.steps <= steps + 1
    assert engine.stalled_for() >= 1.5  # what the worker's /health reports (stalled_s)
    os.kill(members[1].pid, signal.SIGCONT)
    assert await stalled == 8  # the collective resumes where it stood
    assert engine.stalled_for() < 1.0


async def test_a_dead_follower_ends_the_engine_past_the_collective_timeout() -> None:
    port = free_port()
    engine = MockerEngine(
        MockerConfig(nnodes=2, master_port=port, collective_timeout=1.5, speedup_ratio=50)
    )
    member = started_follower(port)  # joins within the 1.5 s bound, even under load
    try:
        await engine.start()
        assert await _tokens(engine, "a", 4) == 4
        member.kill()
        member.wait()
        reading = asyncio.create_task(_tokens(engine, "b", 4))
        death = await asyncio.wait_for(engine.wait_dead(), 60)
        assert isinstance(death, EngineDied) and "not acknowledged" in str(death.__cause__)
        with pytest.raises(Exception, match="mocker engine loop died"):
            await reading
    finally:
        await engine.stop()
        member.wait()


async def test_followers_exit_when_the_leader_goes_away(
    gang: tuple[MockerEngine, list[subprocess.Popen[str]]],
) -> None:
    engine, members = gang
    await engine.stop()  # closes the leader's step channel, as its death would
    for proc in members:
        assert proc.wait(timeout=30) == 1
        assert proc.stderr is not None and "went away" in proc.stderr.read()


async def test_a_gang_that_never_forms_is_an_error_naming_the_missing_rank() -> None:
    port = free_port()
    member = started_follower(port, rank=2, nnodes=3)  # up before the 1 s join bound
    engine = MockerEngine(MockerConfig(nnodes=3, master_port=port, collective_timeout=1))
    try:
        with pytest.raises(GangError, match=rf"rank\(s\) 1 never joined 127.0.0.1:{port}"):
            await engine.start()
    finally:
        member.kill()
        member.wait()


def test_an_unreachable_rendezvous_exits_2_naming_member_and_address() -> None:
    port = free_port()  # nothing listens there
    proc = follower(port, timeout=1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"agg-0.1 on {socket.gethostname()}: cannot reach the leader's rendezvous" in err
    assert f"127.0.0.1:{port} within 1 s (connection refused)" in err


def test_a_gang_refuses_the_virtual_clock() -> None:
    from dynamoctl.engines.mocker.clock import VirtualClock

    with pytest.raises(ValueError, match="real clock"):
        MockerEngine(MockerConfig(nnodes=2), clock=VirtualClock())
