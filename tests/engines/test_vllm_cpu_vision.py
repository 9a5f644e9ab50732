"""A vision-language model on vLLM's CPU build, for real: ``dynamoctl up`` a recipe whose
model is a tiny BLIP-2 built here (vLLM's dummy weights), then the ``openai`` SDK's chat
with an image part (docs/api.md, "Images"; docs/engines.md, "Images"): the image's
tokens are counted in the prompt, vLLM prefills the prompt the frontend built (its
length as the usage says), and an equal image is served from vLLM's prefix cache while
another is not."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.engines.test_vllm_cpu import BLOCK, KV_BYTES, free_port
from tests.engines.tiny_vlm import IMAGE_TOKENS, build_tiny_blip2
from tests.engines.vllm_required import require

require("vllm")

from PIL import Image  # noqa: E402 - Pillow comes with vLLM

pytestmark = [pytest.mark.timeout(420), pytest.mark.openai_compat]

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-cpu-vision"
MODEL = "tiny-blip2"


def recipe(model_dir: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
model: {{name: {MODEL}, path: {model_dir}, block_size: {BLOCK}, context_length: 512}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: vllm
    replicas: 1
    gpus_per_replica: 0
    engine_args:
      enforce-eager: true
      load-format: dummy
      kv-cache-memory-bytes: {KV_BYTES}
      max-num-seqs: 4
      max-num-batched-tokens: 512
    env: {{OMP_NUM_THREADS: "1", VLLM_ENABLE_V1_MULTIPROCESSING: "0"}}
supervision:
  start_timeout: 360
  probe_interval: 0.5
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("vllm-vision")
    model_dir, _ = build_tiny_blip2(tmp / MODEL)
    port = free_port()
    path = tmp / f"{NAME}.yaml"
    path.write_text(recipe(model_dir, port))
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp / "home")}

    def cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dynamoctl", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    try:
        up = cli("up", str(path), "--detach", timeout=390)
        assert up.returncode == 0, up.stderr
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                            max_retries=0, timeout=120)  # fmt: skip
    finally:
        if cli("down", NAME, timeout=120).returncode != 0:
            cli("down", NAME, "--now", timeout=60)


def picture(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (48, 40), colour).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def chat(url: str) -> list[Any]:
    return [{"role": "user", "content": [
        {"type": "text", "text": "Describe the harbour in this picture, with its ships."},
        {"type": "image_url", "image_url": {"url": url}},
    ]}]  # fmt: skip


def test_an_image_chat_on_vllm(client: openai.OpenAI) -> None:
    words = "Describe the harbour in this picture, with its ships."
    text = client.chat.completions.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": words}]
    )
    red = client.chat.completions.create(model=MODEL, messages=chat(picture((200, 0, 0))),
                                         max_tokens=4)  # fmt: skip
    assert red.choices[0].message.content is not None and red.usage is not None
    assert text.usage is not None
    # vLLM reports the prompt it prefilled; the frontend's count (text + the run) matched it
    # (the worker checks nothing of the kind: a different length would show in the cache).
    assert red.usage.prompt_tokens == text.usage.prompt_tokens + IMAGE_TOKENS
    again = client.chat.completions.create(model=MODEL, messages=chat(picture((200, 0, 0))),
                                           max_tokens=4)  # fmt: skip
    blue = client.chat.completions.create(model=MODEL, messages=chat(picture((0, 0, 200))),
                                          max_tokens=4)  # fmt: skip
    assert again.usage is not None and blue.usage is not None
    cached = again.usage.prompt_tokens_details
    assert (
        cached is not None
        and cached.cached_tokens == (red.usage.prompt_tokens - 1) // BLOCK * BLOCK
    )
    # Another image: the images come first on BLIP-2, so nothing of it is shared.
    assert blue.usage.prompt_tokens_details is not None
    assert blue.usage.prompt_tokens_details.cached_tokens == 0


def test_a_broken_image_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, max_tokens=4,
            messages=chat("data:image/png;base64," + base64.b64encode(b"no image").decode()),
        )  # fmt: skip
    assert caught.value.body is not None and caught.value.body["param"] == "messages.0.content.1"  # type: ignore[index]
