"""API keys of a deployment with two frontend processes, end to end through ``up``:
``dynamoctl keys reload`` makes both read the key file now and reports each one's
changes (counts, never a key) or the file's error (the keys before it stay); a key's
limits hold for the deployment, not per process (frontend/tenants/shared.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.supervisor.conftest import Cli, free_port, mocker_recipe

BEFORE = """\
keys:
  - {name: ops, key: sk-ops-5d1e}
  - {name: alice, key: sk-alice-77c0}
  - {name: bob, key: sk-bob-a3f9, limits: {requests_per_minute: 100}}
"""
AFTER = """\
keys:
  - {name: ops, key: sk-ops-5d1e}
  - {name: bob, key: sk-bob-a3f9, limits: {requests_per_minute: 1}}
  - {name: carol, key: sk-carol-19b4}
"""
BROKEN = """\
keys:
  - {name: ops, key: sk-ops-5d1e}
  - {name: carol, key: sk-carol-19b4, limits: {requests_per_minute: 0}}
"""
LIMITED = """\
keys:
  - {name: ops, key: sk-ops-5d1e}
  - {name: paced, key: sk-paced-c2e8, limits: {requests_per_minute: 10}}
  - {name: narrow, key: sk-narrow-0b6d, limits: {concurrent_requests: 2}}
"""
BODY = {"model": "mock-llama", "prompt": "hello", "max_tokens": 2}


def _up(cli: Cli, name: str, keys: Path, extra: str = "") -> int:
    port = free_port()
    text = mocker_recipe(name, port, replicas=1, extra=extra).replace(
        f"frontend: {{port: {port}}}",
        f"frontend: {{port: {port}, processes: 2, api_keys_file: '{keys}'}}",
    )
    up = cli("up", str(cli.recipe(text)), "--detach")
    assert up.returncode == 0, up.stderr
    # Both processes list the model: the supervisor's probe of one may have been answered
    # by the other (they share the port).
    deadline = time.monotonic() + 30
    while set(_statuses(port, "sk-ops-5d1e", 8, check=False)) != {200}:
        assert time.monotonic() < deadline, "a frontend process never served the model"
        time.sleep(0.2)
    return port


def _statuses(port: int, key: str, count: int = 16, check: bool = True) -> list[int]:
    """``count`` completions, each on a new connection (the kernel spreads them over both
    processes: all on one, 1 chance in 2^15)."""
    found = []
    for _ in range(count):
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json=BODY,
            headers={"Authorization": f"Bearer {key}"},
            trust_env=False,
            timeout=30,
        )
        assert not check or reply.status_code in (200, 401, 429), reply.text
        found.append(reply.status_code)
    return found


def _write_unnoticed(path: Path, text: str) -> None:
    """Rewrite ``path`` in place with the same size and time, so that the frontends'
    watch of the file does not see it: only ``keys reload`` reads it."""
    before = path.stat()
    padding = before.st_size - len(text.encode()) - 1
    assert padding >= 0
    with open(path, "r+") as file:
        file.write(text + "#" * padding + "\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino,
    )  # fmt: skip


def test_keys_reload_reaches_every_frontend_and_reports_its_changes(cli: Cli) -> None:
    keys = cli.tmp / "keys.yaml"
    keys.write_text(BEFORE + "#" * 200 + "\n")
    port = _up(cli, "rekey", keys)
    try:
        assert set(_statuses(port, "sk-alice-77c0")) == {200}
        _write_unnoticed(keys, AFTER)
        assert set(_statuses(port, "sk-alice-77c0", 4)) == {200}  # not noticed by itself

        done = cli("keys", "reload", "--name", "rekey")
        assert done.returncode == 0, done.stderr
        lines = sorted(done.stdout.splitlines())
        assert lines == [
            f"frontend-{n}: reloaded: 3 keys (1 added, 1 changed, 1 revoked)" for n in (0, 1)
        ], done.stdout
        assert set(_statuses(port, "sk-alice-77c0")) == {401}  # revoked in both processes
        assert set(_statuses(port, "sk-carol-19b4")) == {200}  # added in both

        keys.write_text(BROKEN)
        refused = cli("keys", "reload", "--name", "rekey", "--json")
        assert refused.returncode == 1
        report = json.loads(refused.stdout)
        assert sorted(a["label"] for a in report["answers"]) == ["frontend-0", "frontend-1"]
        for answer in report["answers"]:
            assert answer["changes"] is None
            assert f"{keys}:3 keys.1.limits.requests_per_minute:" in answer["error"]
        assert set(_statuses(port, "sk-carol-19b4")) == {200}  # the keys before stay
        assert not any("sk-" in text for text in (done.stdout, refused.stdout, refused.stderr))
    finally:
        assert cli("down", "rekey").returncode == 0


@pytest.mark.parametrize("discovery", ["embedded", "etcd"])
def test_limits_hold_for_the_deployment_not_per_process(cli: Cli, discovery: str) -> None:
    """With the embedded store (one host) and a managed etcd (what several hosts use)."""
    keys = cli.tmp / "keys.yaml"
    keys.write_text(LIMITED)
    extra = "discovery: {backend: etcd, managed: true}\n" if discovery == "etcd" else ""
    port = _up(cli, "shared", keys, extra)
    location = cli.status("shared")["discovery"]["location"]
    assert location.startswith("http") if discovery == "etcd" else location.endswith("sqlite3")
    try:
        # 10 requests per minute for the deployment: 20 would pass with one bucket per
        # process. Refilled meanwhile: 1 per 6 s, so at most one more.
        statuses = _statuses(port, "sk-paced-c2e8", 24)
        assert statuses.count(200) in (10, 11), statuses
        assert statuses.count(429) == 24 - statuses.count(200)

        # Two concurrent requests for the deployment: two streams held open, then six
        # more on new connections (per process, up to two more would pass).
        auth = {"Authorization": "Bearer sk-narrow-0b6d"}
        long = {**BODY, "max_tokens": 16000, "stream": True, "ignore_eos": True}
        base = f"http://127.0.0.1:{port}/v1/completions"
        held: list[httpx.Response] = []
        rests: list[Iterator[bytes]] = []
        clients = [httpx.Client(trust_env=False, timeout=60) for _ in range(2)]
        try:
            for client in clients:
                stream = client.send(client.build_request("POST", base, json=long, headers=auth),
                                     stream=True)  # fmt: skip
                assert stream.status_code == 200, (stream.status_code, stream.headers)
                chunks = stream.iter_bytes()
                next(chunks)  # started
                held.append(stream)
                rests.append(chunks)
            more = [0] * 6

            def one(index: int) -> None:
                more[index] = httpx.post(base, json=BODY, headers=auth, trust_env=False).status_code

            threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert more == [429] * 6, more
            for chunks in rests:  # still streaming: the six came while both were in flight
                assert b"[DONE]" not in next(chunks)
        finally:
            for stream in held:
                stream.close()
            for client in clients:
                client.close()
    finally:
        assert cli("down", "shared").returncode == 0


def test_keys_reload_without_a_key_file_says_so(cli: Cli) -> None:
    port = free_port()
    up = cli("up", str(cli.recipe(mocker_recipe("open", port, replicas=1))), "--detach")
    assert up.returncode == 0, up.stderr
    try:
        done = cli("keys", "reload", "--name", "open")
        assert done.returncode == 1
        assert "read no key file (recipe frontend.api_keys_file)" in done.stderr
    finally:
        assert cli("down", "open").returncode == 0
