"""Keys with limits on a real frontend: 429s with OpenAI's headers, the context limit,
usage in /metrics by name (never the key), classes asked for by header, and the key file
changed while the frontend runs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.frontend.conftest import MODEL, START_S, Deployment

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = """\
classes:
  interactive: {weight: 8}
  batch: {weight: 1}
keys:
  - {name: free, key: sk-free-41c7, class: interactive}
  - {name: capped, key: sk-capped-9e02, limits: {requests_per_minute: 2}}
  - {name: thrifty, key: sk-thrifty-77aa, limits: {tokens_per_minute: 50}}
  - {name: single, key: sk-single-03bd, limits: {concurrent_requests: 1}}
  - {name: short, key: sk-short-5f10, class: batch, limits: {max_context: 64}}
"""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def wait_listed(url: str, key: str) -> None:
    async with httpx.AsyncClient() as http:
        deadline = time.monotonic() + START_S
        while not (await http.get(f"{url}/v1/models", headers=auth(key))).json().get("data"):
            assert time.monotonic() < deadline, "frontend never listed the model"
            await asyncio.sleep(0.1)


async def keyed_frontend(dep: Deployment, keys_file: Path, listed_key: str, *args: str) -> str:
    """A frontend of ``dep`` started with ``args`` and reading ``keys_file``, once it lists
    the model to ``listed_key``: its URL."""
    dep.spawn("frontend", "frontend", "--port", "0", *args, "--api-keys-file", str(keys_file))
    await dep.wait_for("frontend", 1)
    url = dep.frontend_url = (await dep.records("frontend"))[0].address
    await wait_listed(url, listed_key)
    return url


@contextlib.asynccontextmanager
async def blocking(
    http: httpx.AsyncClient, url: str, key: str, words: int, max_tokens: int
) -> AsyncIterator[AsyncIterator[bytes]]:
    """A streamed completion of ``words`` words that holds the worker: the rest of its
    chunks, once the first came (it runs)."""
    body = {"model": MODEL, "prompt": "word " * words, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip
    async with http.stream("POST", f"{url}/v1/completions", json=body, headers=auth(key)) as r:
        chunks = r.aiter_bytes()
        await anext(chunks)
        yield chunks


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    tmp = Path(tmp_path_factory.mktemp("limits"))
    (tmp / "keys.yaml").write_text(KEYS)
    dep = Deployment(tmp)
    try:
        dep.worker("--num-workers", "1", "--speedup-ratio", "20")
        await dep.wait_for("worker", 1)
        await keyed_frontend(dep, tmp / "keys.yaml", "sk-free-41c7")
        yield dep
    finally:
        dep.stop()


def body(prompt: str = "hi", max_tokens: int = 2, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            **extra}  # fmt: skip


def check_429(resp: httpx.Response, kind: str) -> None:
    assert resp.status_code == 429, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (kind, "rate_limit_exceeded", None)
    assert int(resp.headers["retry-after"]) >= 1


async def test_requests_per_minute_429_with_openai_headers(keyed: Deployment) -> None:
    url = f"{keyed.frontend_url}/v1/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(url, json=body(), headers=auth("sk-capped-9e02"))
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-reset-requests"].endswith("s")
        assert "x-ratelimit-limit-tokens" not in first.headers  # no token limit on this key
        second = await http.post(url, json=body(stream=True), headers=auth("sk-capped-9e02"))
        assert second.status_code == 200 and second.headers["x-ratelimit-remaining-requests"] == "0"
        third = await http.post(url, json=body(), headers=auth("sk-capped-9e02"))
        check_429(third, "requests")
        assert 20 <= int(third.headers["retry-after"]) <= 30  # one back every 30 s
        assert 20_000 <= int(third.headers["retry-after-ms"]) <= 30_000  # OpenAI's, precise
        assert third.headers["x-ratelimit-remaining-requests"] == "0"
        assert "requests per min (RPM): Limit 2" in third.json()["error"]["message"]
        # Another key is not affected, nor are the paths that generate nothing.
        other = await http.post(url, json=body(), headers=auth("sk-free-41c7"))
        assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers
        models = await http.get(f"{keyed.frontend_url}/v1/models", headers=auth("sk-capped-9e02"))
        assert models.status_code == 200


async def test_tokens_per_minute_count_prompt_and_completion(keyed: Deployment) -> None:
    url = f"{keyed.frontend_url}/v1/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(url, json=body("word " * 30, 30), headers=auth("sk-thrifty-77aa"))
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-tokens"] == "50"
        # A whole answer's headers go out after its tokens were counted.
        assert first.headers["x-ratelimit-remaining-tokens"] == "0"
        used = first.json()["usage"]["total_tokens"]
        assert used > 50
        refused = await http.post(url, json=body(), headers=auth("sk-thrifty-77aa"))
        check_429(refused, "tokens")
        # Overdrawn by used - 50 tokens, refilled at 50 a minute.
        assert int(refused.headers["retry-after"]) >= (used - 50) * 60 // 50 - 2
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_concurrent_requests(keyed: Deployment) -> None:
    url = f"{keyed.frontend_url}/v1/chat/completions"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400, "ignore_eos": True, "stream": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", url, json=chat, headers=auth("sk-single-03bd")) as r:
            chunks = r.aiter_bytes()
            await anext(chunks)
            refused = await http.post(url, json={**chat, "stream": False},
                                      headers=auth("sk-single-03bd"))  # fmt: skip
            check_429(refused, "requests")
            assert "concurrent" in refused.json()["error"]["message"]
            async for _ in chunks:
                pass
        again = await http.post(url, json={**chat, "max_tokens": 2, "stream": False},
                                headers=auth("sk-single-03bd"))  # fmt: skip
        assert again.status_code == 200, again.text


async def test_max_context_and_class_header(keyed: Deployment) -> None:
    url = f"{keyed.frontend_url}/v1/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        ok = await http.post(url, json=body("hi", 40), headers=auth("sk-short-5f10"))
        assert ok.status_code == 200, ok.text
        long = await http.post(url, json=body("hi", 80), headers=auth("sk-short-5f10"))
        assert long.status_code == 400, long.text
        error = long.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
        asked = await http.post(
            url, json=body(), headers={**auth("sk-short-5f10"), "x-dynamoctl-class": "interactive"}
        )
        assert asked.status_code == 400 and asked.json()["error"]["param"] == "x-dynamoctl-class"


async def test_usage_in_metrics_by_name_never_the_key(keyed: Deployment) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        await http.post(f"{keyed.frontend_url}/v1/completions", json=body(max_tokens=3),
                        headers=auth("sk-free-41c7"))  # fmt: skip
        text = (await http.get(f"{keyed.frontend_url}/metrics")).text
    assert "sk-" not in text
    assert 'dynamoctl_frontend_key_requests_total{class="interactive",key="free"}' in text
    assert 'dynamoctl_frontend_key_tokens_total{key="free",kind="completion"}' in text
    assert 'dynamoctl_frontend_key_rate_limited_total{key="capped",limit="requests"} 1.0' in text
    assert 'dynamoctl_frontend_key_rate_limited_total{key="short",limit="context"} 1.0' in text
    assert 'dynamoctl_frontend_key_requests_in_flight{key="free"} 0.0' in text


async def test_keys_added_changed_and_revoked_while_running(keyed: Deployment) -> None:
    path = keyed.tmp / "keys.yaml"
    url = f"{keyed.frontend_url}/v1/completions"
    changed = KEYS.replace("  - {name: free, key: sk-free-41c7, class: interactive}\n", "")
    changed = changed.replace("requests_per_minute: 2", "requests_per_minute: 100")
    changed += "  - {name: late, key: sk-late-6d2e}\n"
    async with httpx.AsyncClient(timeout=30) as http:

        async def status(key: str) -> int:
            return (await http.post(url, json=body(), headers=auth(key))).status_code

        assert await status("sk-late-6d2e") == 401
        path.write_text(changed)
        deadline = time.monotonic() + 15
        while await status("sk-late-6d2e") != 200:
            assert time.monotonic() < deadline, "the new key was never accepted"
            await asyncio.sleep(0.2)
        assert await status("sk-free-41c7") == 401  # revoked
        # The limit grew; what the key used before the change stays used.
        capped = await http.post(url, json=body(), headers=auth("sk-capped-9e02"))
        assert capped.status_code == 200 and capped.headers["x-ratelimit-limit-requests"] == "100"
        assert int(capped.headers["x-ratelimit-remaining-requests"]) <= 97
        path.write_text(changed.replace("concurrent_requests: 1", "concurrent_requests: 0"))
        deadline = time.monotonic() + 15
        while (
            'key_file_reloads_total{result="error"} 1.0'
            not in (await http.get(f"{keyed.frontend_url}/metrics")).text
        ):
            assert time.monotonic() < deadline, "the broken file was never read"
            await asyncio.sleep(0.2)
        assert await status("sk-late-6d2e") == 200  # the keys before it are kept
    log = (keyed.tmp / "frontend.log").read_text()
    assert "keys.yaml:7 keys.2.limits.concurrent_requests" in log
    assert "sk-" not in log
