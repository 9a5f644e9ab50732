"""``dynamoctl worker --engine mocker`` as a real process: discovery, request plane, KV
events, load stream, HTTP endpoints, and a SIGTERM drain with requests in flight."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest

from dynamoctl import wire
from dynamoctl.discovery import Discovery, EventKind, store_from_url
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.planes.events import Event, EventSubscriber, Snapshot
from dynamoctl.planes.request import Overloaded, RemoteError, RequestClient
from dynamoctl.wire.engine import GenerateChunk, GenerateRequest, ModelCard
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.kv_events import BlockStored, decode_batch

NS = "wtest"
BLOCK = 16
BLOCKS = 512


@dataclass
class RunningWorker:
    proc: subprocess.Popen[bytes]
    url: str
    instance_key: str
    record: wire.InstanceRecord
    events: wire.EventsRecord
    card: ModelCard


def start_worker(tmp_path: Path, *extra: str, grace: float = 20.0) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [
            sys.executable, "-m", "dynamoctl", "worker",
            "--namespace", NS, "--discovery", f"embedded://{tmp_path}",
            "--lease-ttl", "2", "--drain-grace", str(grace),
            "--num-gpu-blocks", str(BLOCKS), "--block-size", str(BLOCK),
            "--model", "mock-model", *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


async def wait_registered(url: str, proc: subprocess.Popen[bytes]) -> RunningWorker:
    async with Discovery(store_from_url(url), lease_ttl=2) as disc:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, "worker exited during start-up"
            found = await disc.list(f"{NS}/instances/worker/")
            if found:
                (key, raw), *_ = found.items()
                record = wire.decode_json(raw, wire.InstanceRecord)
                events = await disc.get(f"{NS}/events/worker/{record.instance_id}")
                card = await disc.get(f"{NS}/models/mock-model/{record.instance_id}")
                assert events is not None and card is not None, "instance key must come last"
                return RunningWorker(
                    proc,
                    url,
                    key,
                    record,
                    wire.decode_json(events, wire.EventsRecord),
                    wire.decode_json(card, ModelCard),
                )
            await asyncio.sleep(0.05)
    pytest.fail("worker did not register within 30 s")


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[RunningWorker]:
    proc = start_worker(tmp_path, "--speedup-ratio", "50")
    try:
        yield await wait_registered(f"embedded://{tmp_path}", proc)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


async def generate(
    client: RequestClient, address: str, request: GenerateRequest
) -> list[GenerateChunk]:
    body = wire.engine.encode(request)
    return [wire.engine.decode_chunk(c) async for c in client.stream(address, "generate", body)]


def prompt(n: int, offset: int = 0) -> list[int]:
    return [(offset + i) % 1000 + 1 for i in range(n)]


async def test_registers_model_card_and_serves_generate(worker: RunningWorker) -> None:
    assert worker.card.block_size == BLOCK
    assert worker.card.kv_capacity_blocks == BLOCKS
    assert worker.record.role == "agg" and worker.record.model == "mock-model"
    async with RequestClient() as client:
        request = GenerateRequest("r1", prompt(100), max_tokens=20, ignore_eos=True)
        first = await generate(client, worker.record.address, request)
        again = await generate(
            client, worker.record.address, GenerateRequest("r2", prompt(100), 20, ignore_eos=True)
        )
    assert sum(len(c.token_ids) for c in first) == 20
    assert first[-1].finish_reason == "length"
    assert first[0].prompt_tokens == 100 and first[0].cached_tokens == 0
    assert again[0].cached_tokens == (100 // BLOCK) * BLOCK  # 6 full blocks of the prefix


async def test_token_ids_out_of_u32_are_refused_clearly_and_the_worker_serves_on(
    worker: RunningWorker,
) -> None:
    async with RequestClient() as client:
        for bad in (-1, 1 << 32):
            request = GenerateRequest(f"bad{bad}", [5, bad, 7], max_tokens=4, ignore_eos=True)
            with pytest.raises(RemoteError, match=r"token ids must be in \[0, 2\*\*32\)"):
                await generate(client, worker.record.address, request)
        good = GenerateRequest("good", prompt(40), max_tokens=4, ignore_eos=True)
        chunks = await generate(client, worker.record.address, good)
    assert sum(len(c.token_ids) for c in chunks) == 4


async def test_kv_events_carry_our_block_hashes(worker: RunningWorker) -> None:
    sub = EventSubscriber(topic=worker.events.kv_topic.encode(), idle_poll=0.2)
    await sub.add_publisher("w", worker.events.kv, worker.events.kv_replay)
    tokens = prompt(70, offset=500)
    async with RequestClient() as client:
        await generate(
            client, worker.record.address, GenerateRequest("kv", tokens, 1, ignore_eos=True)
        )
    stored: list[int] = []
    expected = sequence_hashes(tokens, BLOCK)  # 4 full blocks of the prompt
    deadline = time.monotonic() + 10
    while stored[: len(expected)] != expected and time.monotonic() < deadline:
        item = await asyncio.wait_for(sub.get(), 10)
        assert isinstance(item, Event | Snapshot)
        for event in decode_batch(item.payload).events:
            if isinstance(event, BlockStored):
                stored += [int(h) for h in event.block_hashes]
    await sub.close()
    assert stored[: len(expected)] == expected


async def test_load_stream_and_http_endpoints(worker: RunningWorker) -> None:
    sub = EventSubscriber(topic=worker.events.load_topic.encode(), idle_poll=0.2)
    await sub.add_publisher("w", worker.events.load, worker.events.load_replay)
    item = await asyncio.wait_for(sub.get(), 10)
    assert isinstance(item, Event | Snapshot)
    load = wire.engine.decode_load(item.payload)
    assert load.total_blocks == BLOCKS and load.active_blocks == 0
    await sub.close()

    assert worker.record.metrics_url is not None
    base = worker.record.metrics_url.removesuffix("/metrics")
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(worker.record.metrics_url)).text
        health = await http.get(f"{base}/health")
    iid = worker.record.instance_id  # no supervisor label: the name is the instance id
    labels = f'instance="{iid}",model="mock-model",name="{iid}",role="agg"'
    assert f"dynamoctl_worker_kv_total_blocks{{{labels}}} {float(BLOCKS)}" in metrics
    assert "dynamoctl_worker_requests_total" in metrics
    assert health.status_code == 200 and health.json()["status"] == "ready"
    # The supervisor reads /health as a typed contract (not Prometheus text by metric name).
    report = msgspec.json.decode(health.content, type=WorkerHealth)
    assert report.instances == [worker.record.instance_id]
    assert (report.inflight, report.output_tokens) == (0, 0)
    assert worker.record.health_url == f"{base}/health"


async def test_sigterm_drains_in_flight_then_deregisters_then_exits(tmp_path: Path) -> None:
    """Requests in flight at SIGTERM complete; the instance leaves discovery first."""
    url = f"embedded://{tmp_path}"
    proc = start_worker(tmp_path, "--speedup-ratio", "1")  # ~6 ms per token: ~2 s each
    try:
        worker = await wait_registered(url, proc)
        async with Discovery(store_from_url(url), lease_ttl=2) as disc, RequestClient() as client:
            events = disc.watch(worker.instance_key, initial=False)
            deleted_at: list[float] = []

            async def watch_delete() -> None:
                async for event in events:
                    if event.kind is EventKind.DELETE:
                        deleted_at.append(time.monotonic())
                        return

            watcher = asyncio.create_task(watch_delete())
            await asyncio.sleep(0.3)  # the watch is listening
            done_at: list[float] = []
            started = asyncio.Event()

            async def one(i: int) -> list[GenerateChunk]:
                body = wire.engine.encode(
                    GenerateRequest(f"d{i}", prompt(64, 100 * i), max_tokens=300, ignore_eos=True)
                )
                chunks = []
                async for raw in client.stream(worker.record.address, "generate", body):
                    chunks.append(wire.engine.decode_chunk(raw))
                    started.set()
                done_at.append(time.monotonic())
                return chunks

            runs = [asyncio.create_task(one(i)) for i in range(4)]
            await asyncio.wait_for(started.wait(), 10)
            proc.send_signal(signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*runs), 30)
            code = await asyncio.to_thread(proc.wait, 30)
            exited_at = time.monotonic()
            await asyncio.wait_for(watcher, 5)
        for chunks in results:
            assert sum(len(c.token_ids) for c in chunks) == 300
            assert chunks[-1].finish_reason == "length"
        assert code == 0
        assert deleted_at[0] < min(done_at), "deregistered before in-flight work finished"
        assert max(done_at) <= exited_at
    finally:
        stop(proc)


async def test_new_requests_during_drain_are_refused_retryably(tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "--speedup-ratio", "1")
    try:
        worker = await wait_registered(f"embedded://{tmp_path}", proc)
        async with RequestClient() as client:
            long = asyncio.create_task(
                generate(
                    client,
                    worker.record.address,
                    GenerateRequest("long", prompt(32), max_tokens=600, ignore_eos=True),
                )
            )
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            with pytest.raises(Overloaded, match="draining"):
                await generate(client, worker.record.address, GenerateRequest("late", [1, 2], 5))
            assert (await long)[-1].finish_reason == "length"
    finally:
        stop(proc)


async def test_grace_expiry_aborts_explicitly(tmp_path: Path) -> None:
    """Requests that outlive the drain grace end with finish_reason=abort, not a hang."""
    proc = start_worker(tmp_path, "--speedup-ratio", "1", grace=0.5)
    try:
        worker = await wait_registered(f"embedded://{tmp_path}", proc)
        async with RequestClient() as client:
            run = asyncio.create_task(
                generate(
                    client,
                    worker.record.address,
                    GenerateRequest("slow", prompt(32), max_tokens=5000, ignore_eos=True),
                )
            )
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            chunks = await asyncio.wait_for(run, 15)
        assert chunks[-1].finish_reason == "abort"
        assert sum(len(c.token_ids) for c in chunks) < 5000
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        stop(proc)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", "worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unknown_engine_lists_valid_ones() -> None:
    result = cli("--engine", "tgi")
    assert result.returncode == 2
    assert "unknown engine 'tgi'; valid: mocker" in result.stderr


def test_bad_engine_options_name_the_knob(tmp_path: Path) -> None:
    result = cli("--discovery", f"embedded://{tmp_path}", "--num-gpu-blocks", "-5")
    assert result.returncode == 1
    assert "num_gpu_blocks must be >= 1, got -5" in result.stderr
    typo = cli("--discovery", f"embedded://{tmp_path}", "--num-gpu-blokcs", "5")
    assert typo.returncode == 1
    assert "unknown mocker argument --num-gpu-blokcs (did you mean --num-gpu-blocks?)" in (
        typo.stderr
    )


async def test_several_instances_in_one_process(tmp_path: Path) -> None:
    """``--num-workers 3``: three registrations, three engines, one lease (one process)."""
    url = f"embedded://{tmp_path}"
    proc = start_worker(tmp_path, "--num-workers", "3", "--speedup-ratio", "100")
    try:
        await wait_registered(url, proc)
        async with Discovery(store_from_url(url), lease_ttl=2) as disc:
            deadline = time.monotonic() + 20
            while len(found := await disc.list(f"{NS}/instances/worker/")) < 3:
                assert time.monotonic() < deadline, f"only {len(found)} instances registered"
                await asyncio.sleep(0.05)
            records = [wire.decode_json(v, wire.InstanceRecord) for v in found.values()]
            assert len({r.address for r in records}) == 3
            assert len({r.pid for r in records}) == 1
            async with RequestClient() as client:
                for i, record in enumerate(records):
                    request = GenerateRequest(f"n{i}", prompt(40), max_tokens=5, ignore_eos=True)
                    chunks = await generate(client, record.address, request)
                    # Separate engines: none of them has seen this prompt before.
                    assert chunks[0].cached_tokens == 0
                    assert sum(len(c.token_ids) for c in chunks) == 5
            proc.kill()  # no drain: the lease expiry alone must remove all three
            proc.wait()
            deadline = time.monotonic() + 2 + 3
            while await disc.list(f"{NS}/instances/worker/"):
                assert time.monotonic() < deadline, "instances outlived the killed process"
                await asyncio.sleep(0.05)
    finally:
        stop(proc)


async def test_metrics_name_the_worker_as_status_does(tmp_path: Path) -> None:
    """Under a supervisor (``--label``), dashboards show the name ``status`` and logs use."""
    proc = start_worker(tmp_path, "--label", "agg-3")
    try:
        running = await wait_registered(f"embedded://{tmp_path}", proc)
        assert running.record.metrics_url is not None and running.record.label == "agg-3"
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(running.record.metrics_url)).text
    finally:
        stop(proc)
    iid = running.record.instance_id
    labels = f'instance="{iid}",model="mock-model",name="agg-3",role="agg"'
    assert f"dynamoctl_worker_kv_total_blocks{{{labels}}} {float(BLOCKS)}" in metrics
