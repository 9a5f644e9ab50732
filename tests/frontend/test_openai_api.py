"""The frontend against real mocker workers, through the official ``openai`` client and
raw HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import openai
import pytest

from tests.frontend.conftest import MODEL, Deployment

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # well over 2 KV blocks


def client(dep: Deployment) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0)


async def test_openai_client_chat_and_completions(deployment: Deployment) -> None:
    oai = client(deployment)
    models = await oai.models.list()
    assert [m.id for m in models.data] == [MODEL]

    chat = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=10,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 10
    first_prompt_tokens = chat.usage.prompt_tokens

    again = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    # kv routing sent it back to the worker that cached the prompt: all full blocks hit.
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= (first_prompt_tokens // 16 - 1) * 16 > 0

    stream = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8

    text = await oai.completions.create(model=MODEL, prompt="Once upon", max_tokens=5)
    assert text.choices[0].finish_reason in ("length", "stop")
    assert text.usage is not None and 1 <= text.usage.completion_tokens <= 5
    await oai.close()


async def test_sse_framing_byte_for_byte(deployment: Deployment) -> None:
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": True,
            "ignore_eos": True, "seed": 1}  # fmt: skip
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{deployment.frontend_url}/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([part async for part in resp.aiter_bytes()])
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") and b"\n" not in e for e in events[:-2])
    first = payloads[0]
    assert set(first) == {"id", "object", "created", "model", "choices"}
    assert first["object"] == "text_completion" and first["model"] == MODEL
    assert first["choices"][0]["index"] == 0 and first["choices"][0]["logprobs"] is None
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert len({p["id"] for p in payloads}) == 1


async def test_stop_strings_end_the_text_before_the_stop(deployment: Deployment) -> None:
    oai = client(deployment)
    base = dict(model=MODEL, prompt="seeded", max_tokens=24, seed=7,
                extra_body={"ignore_eos": True})  # fmt: skip
    full = (await oai.completions.create(**base)).choices[0].text  # type: ignore[call-overload]
    assert len(full) > 12
    stop = full[6:10]
    cut = await oai.completions.create(stop=[stop], **base)  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]
    await oai.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "mock-llama", "prompt": "\xff\xfe"}', 400, "not valid UTF-8"),
        (b"[1, 2, 3]", 400, "JSON object"),
        (b'{"model": "mock-llama", "prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
        (b'{"model": "mock-llama", "prompt": "x", "max_tokens": 1e300}', 400, "max_tokens"),
        (
            b'{"model": "mock-llama", "prompt": "x", "max_tokens": 99999999999999}',
            400,
            "max_tokens",
        ),
        (b'{"model": "mock-llama", "prompt": "x", "bogus": 1}', 400, "bogus"),
        (b'{"model": "mock-llama", "prompt": "x", "n": 65}', 400, "max_choices"),
        (b'{"model": "mock-llama", "prompt": "x", "logprobs": 21}', 400, "logprobs"),
        (b'{"model": "mock-llama", "prompt": "x", "best_of": 2}', 400, "best_of"),
        (b'{"model": "mock-llama", "prompt": [-1, 5]}', 400, "token ids"),
        (b'{"model": "nope", "prompt": "x"}', 404, "does not exist"),
        (b'{"model": "mock-llama", "prompt": "x", "max_tokens": 999999}', 400, "context length"),
        (b'{"model": "mock-llama", "prompt": "x", "temperature": -1}', 400, "temperature"),
        (b'{"model": "mock-llama", "prompt": "x", "stop": ["", "a"]}', 400, "stop"),
        (b'{"model": "mock-llama"}', 400, "prompt"),
    ],
)
async def test_bad_requests_get_openai_errors(
    shared_deployment: Deployment, body: bytes, status: int, needle: str
) -> None:
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"{shared_deployment.frontend_url}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"]


async def test_oversized_body_is_413(deployment: Deployment) -> None:
    body = json.dumps({"model": MODEL, "prompt": "x" * (10 * 1024 * 1024)}).encode()
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{deployment.frontend_url}/v1/completions", content=body)
    assert resp.status_code == 413
    assert "exceeds" in resp.json()["error"]["message"]


async def test_metrics_health_and_openapi(deployment: Deployment) -> None:
    oai = client(deployment)
    await oai.completions.create(model=MODEL, prompt="x", max_tokens=2)
    await oai.close()
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{deployment.frontend_url}/metrics")).text
        health = await http.get(f"{deployment.frontend_url}/health")
        spec = (await http.get(f"{deployment.frontend_url}/openapi.json")).json()
    assert f'dynamoctl_frontend_time_to_first_token_seconds_count{{model="{MODEL}"}} 1.0' in metrics
    assert "dynamoctl_frontend_requests_total" in metrics
    assert health.status_code == 200 and health.json()["models"] == [MODEL]
    assert "/v1/chat/completions" in spec["paths"]


async def inflight_of(metrics_url: str | None) -> int:
    """Sum of ``dynamoctl_worker_inflight_requests`` on one worker process."""
    assert metrics_url is not None
    async with httpx.AsyncClient() as http:
        text = (await http.get(metrics_url)).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("dynamoctl_worker_inflight_requests{")
    )


async def worker_inflight(dep: Deployment) -> int:
    urls = {r.metrics_url for r in await dep.records("worker")}  # instances share a process
    return sum([await inflight_of(url) for url in urls])


async def test_client_disconnect_cancels_work_on_the_worker(deployment: Deployment) -> None:
    body = {"model": MODEL, "prompt": "go", "max_tokens": 5000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{deployment.frontend_url}/v1/completions", json=body) as resp,
    ):
        async for _ in resp.aiter_bytes():  # streaming has started
            assert await worker_inflight(deployment) == 1
            break
    # Connection closed: the worker's stream must be cancelled, not run to 5000 tokens.
    deadline = time.monotonic() + 10
    while await worker_inflight(deployment) != 0:
        assert time.monotonic() < deadline, "worker still generating for a gone client"
        await asyncio.sleep(0.1)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{deployment.frontend_url}/metrics")).text
    assert f'dynamoctl_frontend_cancellations_total{{model="{MODEL}"}} 1.0' in metrics


async def test_killed_worker_mid_stream_migrates(tmp_path: object) -> None:
    """SIGKILL the worker serving a stream: the client still gets every token."""
    from pathlib import Path

    dep = Deployment(Path(str(tmp_path)))
    try:
        for _ in range(2):  # two processes, so one can die alone
            dep.worker("--speedup-ratio", "1")
        await dep.wait_for("worker", 2)
        await dep.start_frontend()
        oai = client(dep)
        stream = await oai.completions.create(
            model=MODEL, prompt="migrate me", max_tokens=400, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 5:
                victims = [
                    record.pid
                    for record in await dep.records("worker")
                    if await inflight_of(record.metrics_url) > 0
                ]
                assert len(victims) == 1
                os.kill(victims[0], signal.SIGKILL)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 400
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "length"
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{dep.frontend_url}/metrics")).text
        assert f'dynamoctl_frontend_migrations_total{{model="{MODEL}"}} 1.0' in metrics
        await oai.close()
    finally:
        dep.stop()
