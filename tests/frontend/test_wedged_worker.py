"""A wedged worker (SIGSTOP: its sockets stay open, nothing answers), seen by the
frontend: the stream on it migrates once the worker has been silent for the frontend's
``--stream-silence-timeout``, and no new request goes to it while it stays frozen, though
its discovery record lives on (5-minute lease) and its cache makes the KV router prefer it
(docs/operations.md, "Wedged instances")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tests.frontend.conftest import MODEL
from tests.frontend.test_fast_death import (
    LongLeaseDeployment,
    busy_worker,
    migrations,
    two_workers,
)

__all__ = ["two_workers"]  # the fixture, shared


async def test_a_frozen_worker_is_left_at_once_and_gets_no_new_request(
    two_workers: LongLeaseDeployment,
) -> None:
    dep, url = two_workers, two_workers.frontend_url
    prompt = "the same long prompt " * 40  # cached where it ran: the KV router prefers it
    records = {r.pid: r for r in await dep.records("worker")}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "stream": True,
            "ignore_eos": True}  # fmt: skip
    text, finish, frozen = "", None, None
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            async for choice in streamed_choices(http, f"{url}/v1/completions", body):
                text += choice["text"]
                finish = choice["finish_reason"] or finish
                if frozen is None and len(text.split()) >= 20:
                    frozen = await busy_worker(http, records.values())
                    os.kill(frozen, signal.SIGSTOP)
            assert frozen is not None and finish == "length"
            assert await migrations(http, url) == 1
            # Frozen, registered and holding the prompt's cache: still nothing goes there
            # (each request would wait out the silence and migrate).
            for _ in range(10):
                reply = await http.post(
                    f"{url}/v1/completions",
                    json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
                )
                assert reply.status_code == 200, reply.text
            assert await migrations(http, url) == 1
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
    log = (dep.tmp / "frontend.log").read_text()
    assert "heartbeat_timeout 1.5s" in log  # the recipe's default bound, not the old 3 s
    assert "skipped until it answers again" in log


async def test_a_stream_whose_worker_dies_waits_for_the_other_one_stalled(
    two_workers: LongLeaseDeployment,
) -> None:
    """The only worker left to resume a stream is stalled (SIGSTOP for a few seconds: a
    loaded host, a long pause): the migration waits in the admission queue for it to
    answer heartbeats again and the client gets one complete response, not a 503."""
    dep, url = two_workers, two_workers.frontend_url
    records = {r.pid: r for r in await dep.records("worker")}
    body = {"model": MODEL, "prompt": "a stalled neighbour " * 20, "max_tokens": 600,
            "stream": True, "ignore_eos": True}  # fmt: skip
    log = dep.tmp / "frontend.log"
    text, finish, stalled = "", None, None
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            async for choice in streamed_choices(http, f"{url}/v1/completions", body):
                text += choice["text"]
                finish = choice["finish_reason"] or finish
                if stalled is None and len(text.split()) >= 10:
                    busy = await busy_worker(http, records.values())
                    stalled = next(pid for pid in records if pid != busy)
                    # Another prompt goes to the idle worker (the KV router's load
                    # term): the frontend is connected to both, and heartbeats both.
                    other = {"model": MODEL, "prompt": "elsewhere", "max_tokens": 4}
                    reply = await http.post(f"{url}/v1/completions", json=other)
                    assert reply.status_code == 200, reply.text
                    os.kill(stalled, signal.SIGSTOP)
                    await until_logged(log, "skipped until it answers again")
                    os.kill(busy, signal.SIGKILL)  # its stream can only go to the stalled
                    await asyncio.sleep(1.0)  # the migration waits meanwhile
                    os.kill(stalled, signal.SIGCONT)
            assert stalled is not None and finish == "length"
            assert await migrations(http, url) == 1
    finally:
        if stalled is not None:
            os.kill(stalled, signal.SIGCONT)


async def until_logged(log: Path, words: str) -> None:
    """Wait (bounded) until the frontend's log says ``words``."""
    async with asyncio.timeout(20):
        # A file has no event to await.
        while words not in await asyncio.to_thread(log.read_text, errors="replace"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def streamed_choices(
    http: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """The first choice of each event of a streamed completion; none may be an error."""
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            yield event["choices"][0]
