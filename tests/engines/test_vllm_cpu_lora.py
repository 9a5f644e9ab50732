"""vLLM on CPU serving a LoRA adapter, for real: a tiny Llama with random weights and a
rank-8 adapter made with peft from random weights (both built here), declared in the
recipe; then a second adapter loaded and unloaded at run time through the supervisor
(``dynamoctl lora``), which reaches vLLM's ``add_lora``/``remove_lora``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engines.tiny_llama import build_tiny_llama
from tests.engines.tiny_lora import build_tiny_lora
from tests.infra.ports import free_port

for needed in ("vllm", "peft"):
    if importlib.util.find_spec(needed) is None:
        if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
            pytest.fail(f"{needed} is not installed (scripts/install-deps.sh installs it)")
        pytest.skip(f"{needed} is not installed (scripts/install-deps.sh installs it)",
                    allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-lora"
MODEL = "tiny-llama"
PROMPT = "The harbour master counted the ships that came in with the morning tide. " * 4


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "DYNAMOCTL_HOME": str(home)}, timeout=timeout,
    )  # fmt: skip


def recipe(model_dir: Path, sql: Path, port: int) -> str:
    return f"""\
schema: 1
name: {NAME}
model: {{name: {MODEL}, path: {model_dir}, block_size: 32, context_length: 2048}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: vllm
    replicas: 1
    gpus_per_replica: 0
    engine_args:
      enforce-eager: true
      kv-cache-memory-bytes: {16 << 20}
      max-num-seqs: 4
      max-num-batched-tokens: 1024
    env: {{OMP_NUM_THREADS: "1", VLLM_ENABLE_V1_MULTIPROCESSING: "0"}}
    lora:
      max_loras: 2
      max_rank: 8
      adapters: [{{name: sql, path: {sql}, base_model: {model_dir}}}]
supervision:
  start_timeout: 300
  probe_interval: 0.5
  drain_timeout: 60
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path]]:
    tmp = tmp_path_factory.mktemp("vllm-lora")
    model_dir = build_tiny_llama(tmp / MODEL)
    sql = build_tiny_lora(model_dir, tmp / "sql", seed=1)
    chat = build_tiny_lora(model_dir, tmp / "chat", seed=2)
    port = free_port()
    path = tmp / f"{NAME}.yaml"
    path.write_text(recipe(model_dir, sql, port))
    home = tmp / "home"
    try:
        up = cli(home, "up", str(path), "--detach", timeout=330)
        assert up.returncode == 0, up.stderr
        yield home, f"http://127.0.0.1:{port}", chat
    finally:
        if cli(home, "down", NAME, timeout=120).returncode != 0:
            cli(home, "down", NAME, "--now", timeout=60)


def greedy(http: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    return http.post("/v1/completions", json=body)


def wait_models(http: httpx.Client, want: set[str], timeout: float = 60.0) -> dict[str, dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        data = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        if set(data) == want:
            return data
        assert time.monotonic() < deadline, f"models {sorted(data)}, wanted {want}"
        time.sleep(0.3)


def test_vllm_serves_a_peft_adapter_and_loads_another_at_run_time(
    deployment: tuple[Path, str, Path],
) -> None:
    home, url, chat = deployment
    http = httpx.Client(base_url=url, timeout=120, trust_env=False)
    models = wait_models(http, {MODEL, "sql"})
    assert models["sql"]["parent"] == MODEL
    base, sql = greedy(http, MODEL), greedy(http, "sql")
    assert base.status_code == 200 and sql.status_code == 200, sql.text
    # Random adapter weights: vLLM applied them, so the greedy tokens are not the base's.
    assert sql.json()["choices"][0]["text"] != base.json()["choices"][0]["text"]

    # The adapter's blocks are its own: the base model's cached prompt is no hit for it,
    # its own second run is.
    def cached(response: httpx.Response) -> int:
        return int((response.json()["usage"].get("prompt_tokens_details") or {}).get(
            "cached_tokens", 0))  # fmt: skip

    assert cached(greedy(http, MODEL)) > 0 and cached(sql) == 0
    assert cached(greedy(http, "sql")) > 0

    loaded = cli(home, "lora", "load", "chat", str(chat), "--timeout", "120", timeout=180)
    assert loaded.returncode == 0, loaded.stderr
    chat_out = greedy(http, "chat")
    assert chat_out.status_code == 200, chat_out.text
    assert chat_out.json()["choices"][0]["text"] != sql.json()["choices"][0]["text"]
    listing = json.loads(cli(home, "lora", "ls", "--json").stdout)["adapters"]
    assert {a["spec"]["name"]: a["workers"] for a in listing} == {
        "chat": ["agg-0"], "sql": ["agg-0"],
    }  # fmt: skip
    assert cli(home, "lora", "unload", "chat").returncode == 0
    wait_models(http, {MODEL, "sql"})
    assert greedy(http, "chat").status_code == 404
