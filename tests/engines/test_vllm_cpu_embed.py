"""An embedding model on vLLM's CPU build, for real: ``dynamoctl up`` a recipe with
``model.task: embed`` (vLLM's ``--runner pooling`` on a tiny Llama with random weights,
built here, declared a Matryoshka model), then the ``openai`` SDK's embeddings against
it (docs/api.md, "Embeddings")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.engines.test_vllm_cpu import BLOCK, KV_BYTES, free_port
from tests.engines.tiny_llama import build_tiny_llama
from tests.engines.vllm_required import require

require("vllm")

pytestmark = [pytest.mark.timeout(300), pytest.mark.openai_compat]

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-cpu-embed"
MODEL = "tiny-embed"


def recipe(model_dir: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
model: {{name: {MODEL}, path: {model_dir}, block_size: {BLOCK}, context_length: 2048,
         task: embed}}
frontend: {{port: {port}, router: {{mode: least-loaded}}}}
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
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("vllm-embed")
    model_dir = build_tiny_llama(tmp / MODEL)
    config = json.loads((model_dir / "config.json").read_text())
    config["is_matryoshka"] = True  # vLLM then honours a request's dimensions
    (model_dir / "config.json").write_text(json.dumps(config))
    port = free_port()
    path = tmp / f"{NAME}.yaml"
    path.write_text(recipe(model_dir, port))
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp / "home")}

    def cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dynamoctl", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    try:
        up = cli("up", str(path), "--detach", timeout=270)
        assert up.returncode == 0, up.stderr
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                            max_retries=0, timeout=60)  # fmt: skip
    finally:
        if cli("down", NAME, timeout=120).returncode != 0:
            cli("down", NAME, "--now", timeout=60)


def test_sdk_embeddings_from_vllms_pooler(client: openai.OpenAI) -> None:
    texts = ["The harbour master counted the ships.", "Ships came in with the morning tide."]
    packed = client.embeddings.create(model=MODEL, input=texts)  # the SDK's base64
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1]
    for a, b in zip(packed.data, floats.data, strict=True):
        assert len(a.embedding) == 128  # the tiny Llama's hidden size
        assert np.array_equal(a.embedding, np.asarray(b.embedding, dtype=np.float32))
        assert np.linalg.norm(b.embedding) == pytest.approx(1.0, abs=1e-4)  # vLLM normalises
    assert floats.data[0].embedding != floats.data[1].embedding
    assert floats.usage.prompt_tokens == packed.usage.prompt_tokens > 10
    again = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert np.allclose(again.data[0].embedding, floats.data[0].embedding, atol=1e-5)
    short = client.embeddings.create(model=MODEL, input=texts[0], dimensions=32)
    assert len(short.data[0].embedding) == 32
    assert np.linalg.norm(short.data[0].embedding) == pytest.approx(1.0, abs=1e-4)


def test_text_generation_on_the_embedding_model_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert caught.value.body is not None and caught.value.body["param"] == "model"  # type: ignore[index]
