"""``dynamoctl router`` as its own process, against real mocker workers and a frontend
started with ``--router standalone``: OpenAI requests routed by KV overlap, replicas that
agree on booked load and fail over, a restarted router that rebuilds its index."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl.planes.request import RequestClient
from dynamoctl.wire import router as wire_router
from dynamoctl.wire.router import RouteEvent, RouteNotify, RouteReply, RouteRequest
from tests.frontend.conftest import MODEL, Deployment
from tests.router.test_mocker_workers import NEW, SESSIONS, SYSTEM, TURNS

BLOCK = 16
WORKERS = 4
pytestmark = pytest.mark.timeout(150)


class Routed(Deployment):
    """The frontend tests' deployment plus router processes."""

    def workers(self, speedup: float) -> None:
        self.spawn(
            "worker", "worker", "--num-workers", str(WORKERS), "--drain-grace", "1",
            "--model", MODEL, "--block-size", str(BLOCK), "--num-gpu-blocks", "2048",
            "--speedup-ratio", str(speedup),
        )  # fmt: skip

    def router(self, name: str, *extra: str) -> int:
        """Start a router replica; its index in ``procs``."""
        self.spawn(name, "router", "--warm-up", "2", *extra)
        return len(self.procs) - 1

    async def router_metrics(self, n: int, timeout: float = 30) -> dict[str, str]:
        """Wait for ``n`` replicas, each with every worker: instance id → metrics URL."""
        deadline = time.monotonic() + timeout
        while True:
            urls = {r.instance_id: r.metrics_url or "" for r in await self.records("router")}
            try:  # a killed replica's record stays until its lease expires
                seen = [await scrape(u, "dynamoctl_router_workers") for u in urls.values()]
            except httpx.TransportError:
                seen = []
            if len(seen) == n and all(s.get((MODEL,)) == WORKERS for s in seen):
                return urls
            assert time.monotonic() < deadline, f"routers {urls} saw workers {seen}"
            await asyncio.sleep(0.1)

    async def other_frontend(self, *extra: str) -> str:
        """A second frontend (embedded router), once it lists the model: its URL."""
        known = {r.address for r in await self.records("frontend")}
        self.spawn("frontend-2", "frontend", "--port", "0", *extra)
        await self.wait_for("frontend", len(known) + 1)
        (url,) = [r.address for r in await self.records("frontend") if r.address not in known]
        async with httpx.AsyncClient() as http:
            for _ in range(300):
                if (await http.get(f"{url}/v1/models")).json()["data"]:
                    return url
                await asyncio.sleep(0.1)
        pytest.fail("second frontend never listed the model")

    async def frontend_sees_replicas(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        metrics = f"{self.frontend_url}/metrics"
        while (await scrape(metrics, "dynamoctl_frontend_router_replicas")).get(()) != n:
            assert time.monotonic() < deadline, f"the frontend never saw {n} router replicas"
            await asyncio.sleep(0.05)

    async def worker_requests(self) -> dict[str, float]:
        """Requests received so far by each worker instance."""
        (url,) = {r.metrics_url for r in await self.records("worker")}
        assert url is not None
        counts = await scrape(url, "dynamoctl_worker_requests")
        return {labels[0]: n for labels, n in counts.items()}


@pytest.fixture
async def dep(tmp_path: Path) -> AsyncIterator[Routed]:
    deployment = Routed(tmp_path)
    try:
        yield deployment
    finally:
        deployment.stop()


async def scrape(url: str, name: str) -> dict[tuple[str, ...], float]:
    """Samples of metric ``name`` (counters without ``_total``), by label values."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(url, timeout=5)).text
    return {
        tuple(sample.labels.values()): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


async def booked_view(url: str) -> dict[tuple[str, ...], float]:
    """A replica's booked load: every series of every ``booked_*`` gauge, and its count of
    bookings whatever their origin."""
    view: dict[tuple[str, ...], float] = {}
    for name in ("booked_prefill_tokens", "booked_active_blocks", "booked_requests"):
        for labels, value in (await scrape(url, f"dynamoctl_router_{name}")).items():
            view[(name, *labels)] = value
    bookings = await scrape(url, "dynamoctl_router_bookings")
    view[("bookings",)] = sum(bookings.values())
    return view


async def views_agree(urls: list[str], requests: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        views = [await booked_view(u) for u in urls]
        if all(v == views[0] for v in views) and views[0][("bookings",)] == requests:
            return
        assert time.monotonic() < deadline, f"booked views differ: {views}"
        await asyncio.sleep(0.1)


def oai(url: str) -> openai.AsyncOpenAI:
    # The SDK's default retries: three clean-clone CI runs on a 2-core machine (2026-11-29)
    # each saw one connect to a serving frontend on 127.0.0.1 time out (5 s; 30 s when
    # given longer), the host counting no SYN retransmitted; cause not found. A request
    # that never connected never reached the frontend, so no pick is counted twice.
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2)


async def multi_turn(url: str, seed: int) -> float:
    """tests/router/test_mocker_workers.py's workload, as OpenAI completions with token-id
    prompts: the prefix hit rate of follow-up turns, from ``usage``."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 30000) for _ in range(SYSTEM)]
    prompts = [list(system) for _ in range(SESSIONS)]
    totals = [0, 0]
    client = oai(url)

    async def session(s: int) -> None:
        for turn in range(TURNS):
            await asyncio.sleep(rng.uniform(0.05, 0.2))
            prompts[s] += [rng.randrange(1, 30000) for _ in range(NEW)]
            done = await client.completions.create(
                model=MODEL, prompt=prompts[s], max_tokens=4, extra_body={"ignore_eos": True}
            )
            usage = done.usage
            assert usage is not None and usage.prompt_tokens == len(prompts[s])
            if turn:
                details = usage.prompt_tokens_details
                totals[0] += usage.prompt_tokens
                totals[1] += (details.cached_tokens or 0) if details else 0

    await asyncio.gather(*(session(s) for s in range(SESSIONS)))
    return totals[1] / totals[0]


async def test_standalone_router_serves_openai_and_routes_by_kv(dep: Routed) -> None:
    dep.workers(speedup=100)
    dep.router("router-a")
    await dep.wait_for("worker", WORKERS)
    (metrics_url,) = (await dep.router_metrics(1)).values()
    await dep.start_frontend("--router", "standalone")
    rr_url = await dep.other_frontend("--router-mode", "round-robin")  # the baseline

    chat = await oai(dep.frontend_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.usage is not None and chat.usage.completion_tokens == 5

    kv = await multi_turn(dep.frontend_url, seed=10)
    rr = await multi_turn(rr_url, seed=20)  # fresh tokens: no shared cache
    print(f"prefix hit rate via the standalone router: kv {kv:.3f}, round-robin {rr:.3f}")
    assert kv >= rr + 0.2
    picks = await scrape(metrics_url, "dynamoctl_router_picks")
    assert picks == {(MODEL, "routed"): 1 + SESSIONS * TURNS}
    await views_agree([metrics_url], requests=0)  # every booking released by the frontend


async def test_replicas_share_bookings_and_fail_over(dep: Routed) -> None:
    dep.workers(speedup=1)  # slow: long requests stay in flight for the whole test
    a = dep.router("router-a")
    await dep.wait_for("worker", WORKERS)
    await dep.router_metrics(1)
    await dep.start_frontend("--router", "standalone")

    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))

        streams: list[AsyncIterator[bytes]] = []

        async def start_long(i: int) -> None:
            body = {"model": MODEL, "prompt": [1000 + i] * 100, "max_tokens": 5000,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            ctx = http.stream("POST", f"{dep.frontend_url}/v1/completions", json=body)
            response = await stack.enter_async_context(ctx)
            assert response.status_code == 200
            chunks = response.aiter_bytes()
            await anext(chunks)  # the first token came: its prefill booking is released
            streams.append(chunks)  # dropping the iterator would close the stream

        for i in range(4):  # booked by replica A alone
            await start_long(i)
        dep.router("router-b")
        urls = list((await dep.router_metrics(2)).values())
        await views_agree(urls, requests=4)  # B took A's bookings from its stream
        await dep.frontend_sees_replicas(2)
        for i in range(4, 8):  # spread over A and B
            await start_long(i)
        await views_agree(urls, requests=8)
        for url in urls:
            own = await scrape(url, "dynamoctl_router_bookings")
            assert own[(MODEL, "own")] > 0, "the frontend should spread over both replicas"

        async def short(i: int) -> str:
            body = {"model": MODEL, "prompt": [7, i % 50] * 40, "max_tokens": 3,
                    "ignore_eos": True}  # fmt: skip
            done = await http.post(f"{dep.frontend_url}/v1/completions", json=body)
            return "ok" if done.status_code == 200 else f"{done.status_code} {done.text}"

        statuses: list[str] = []
        quarter = asyncio.Event()

        async def load(worker: int) -> None:
            for i in range(worker, 60, 6):
                statuses.append(await short(i))
                if len(statuses) >= 15:
                    quarter.set()

        loaders = asyncio.gather(*(load(w) for w in range(6)))
        await quarter.wait()
        dep.procs[a].kill()  # kill -9 replica A mid-load
        await loaders
        assert statuses == ["ok"] * 60
        failovers = await scrape(
            f"{dep.frontend_url}/metrics", "dynamoctl_frontend_router_failovers"
        )
        assert failovers[()] >= 1

    # The long requests are cancelled (their clients hang up): the frontend releases B's
    # bookings; A's died with its lease.
    (b_url,) = (await dep.router_metrics(1)).values()
    await views_agree([b_url], requests=0, timeout=15)
    booked = await booked_view(b_url)
    assert all(v == 0 for v in booked.values()), booked


async def route(address: str, prompt: list[int], rid: str) -> RouteReply:
    """Ask a router over the wire where ``prompt`` goes, then release the booking."""
    async with RequestClient() as client:
        body = wire_router.encode(RouteRequest(MODEL, rid, prompt))
        (raw,) = [c async for c in client.stream(address, "route", body)]
        release = RouteNotify([RouteEvent(MODEL, rid, "finished")])
        assert [c async for c in client.stream(address, "route", wire_router.encode(release))] == []
    answer = wire_router.decode_answer(raw)
    assert isinstance(answer, RouteReply), answer
    return answer


async def test_restarted_router_rebuilds_its_index_from_the_workers(dep: Routed) -> None:
    dep.workers(speedup=100)
    first = dep.router("router-1")
    await dep.wait_for("worker", WORKERS)
    await dep.router_metrics(1)
    await dep.start_frontend("--router", "standalone")
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 30000) for _ in range(10 * BLOCK)] for _ in range(4)]
    owners: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for prompt in prompts:
            before = await dep.worker_requests()
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            assert (await http.post(f"{dep.frontend_url}/v1/completions", json=body)).is_success
            after = await dep.worker_requests()
            (owner,) = [w for w, n in after.items() if n != before.get(w, 0)]
            owners.append(owner)

        dep.procs[first].kill()
        dep.procs[first].wait()
        await dep.frontend_sees_replicas(0, timeout=15)  # its record goes with its lease
        body = {"model": MODEL, "prompt": prompts[0], "max_tokens": 2}
        refused = await http.post(f"{dep.frontend_url}/v1/completions", json=body)
        assert refused.status_code == 503
        assert "no router replica in discovery" in refused.json()["error"]["message"]
        dep.router("router-2")
        await dep.router_metrics(1)  # the killed one's record has expired, the new one is up
        (record,) = await dep.records("router")
        assert record.pid != dep.procs[first].pid
        address = record.address
        deadline = time.monotonic() + 10
        for i, (prompt, owner) in enumerate(zip(prompts, owners, strict=True)):
            while True:  # the KV streams replay to the new router within moments
                reply = await route(address, [*prompt, *range(1, BLOCK + 1)], f"probe-{i}")
                if (reply.worker_id, reply.overlap_blocks) == (owner, 10):
                    break
                assert time.monotonic() < deadline, f"prompt {i}: {reply}, cached on {owner}"
                await asyncio.sleep(0.1)

        for prompt, owner in zip(prompts, owners, strict=True):  # and so does the frontend
            before = await dep.worker_requests()
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            done = (await http.post(f"{dep.frontend_url}/v1/completions", json=body)).json()
            assert done["usage"]["prompt_tokens_details"]["cached_tokens"] >= 9 * BLOCK
            after = await dep.worker_requests()
            assert [w for w, n in after.items() if n != before.get(w, 0)] == [owner]
    log = (dep.tmp / "router-2.log").read_text()
    assert not re.search(r"Traceback|ERROR", log), log
