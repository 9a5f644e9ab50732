"""The load generator keeps connections alive: N requests open far fewer than N
connections, counted where they are accepted, and a connection the server closed while
idle is replaced without an error."""

from __future__ import annotations

import contextlib
import json

from rich.console import Console

from dynamoctl.bench.http import Endpoint, ResponseCut, post_sse
from dynamoctl.bench.runner import run_bench
from dynamoctl.bench.schedule import Limits
from tests.bench.conftest import FakeServer
from tests.bench.test_statistics import REQUESTS, config

PAYLOAD = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()


async def test_requests_share_connections(fake_server: FakeServer) -> None:
    requests = 3 * REQUESTS
    cfg = config(fake_server, concurrency=[4], limits=Limits(requests, 30, 10))
    s = (await run_bench(cfg, console=Console(quiet=True))).runs[0].summary
    assert (s.completed, s.errors) == (requests, {})
    assert s.prefix_hit_rate == 0.5  # the statistics are those of the per-request client
    # one connection per closed-loop slot (the /v1/models lookup reuses one of them)
    assert 1 <= fake_server.connections <= 4


async def test_server_closing_a_kept_connection_is_no_error(fake_server: FakeServer) -> None:
    fake_server.max_per_connection = 3
    requests = 3 * REQUESTS
    cfg = config(fake_server, concurrency=[4], limits=Limits(requests, 30, 10))
    s = (await run_bench(cfg, console=Console(quiet=True))).runs[0].summary
    assert (s.completed, s.errors) == (requests, {})
    assert fake_server.dropped > 0  # requests really were sent on connections then closed
    assert len(fake_server.requests) == requests  # and each answered exactly once
    assert fake_server.connections >= requests / 3


async def test_errors_end_their_connection_and_the_next_request_works(
    fake_server: FakeServer,
) -> None:
    fake_server.truncate_every = 2  # every other stream is cut, its connection closed
    endpoint = Endpoint(fake_server.url)
    done = []
    for _ in range(4):
        events = []
        with contextlib.suppress(ResponseCut):  # the cut ones
            async for data in post_sse(endpoint, "/v1/completions", PAYLOAD):
                events.append(data)
        done.append(b"[DONE]" in events)
    await endpoint.close()
    assert done == [True, False, True, False]
    assert fake_server.connections == 2  # a new one after each cut stream
    assert endpoint.opened == 2


async def test_without_keep_alive_every_request_opens_a_connection(
    fake_server: FakeServer,
) -> None:
    endpoint = Endpoint(fake_server.url, keep_alive=False)
    for _ in range(3):
        assert b"[DONE]" in [data async for data in post_sse(endpoint, "/v1/completions", PAYLOAD)]
    assert fake_server.connections == 3 == endpoint.opened
