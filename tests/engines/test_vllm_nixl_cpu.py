"""Disaggregated prefill/decode through ``VllmEngine`` on CPU with vLLM's NixlConnector:
the prefill's ``kv_transfer_params`` travel opaquely to the decode, whose greedy output
equals an aggregated run.

``scripts/install-deps.sh`` installs NIXL (``pip install --no-deps nixl==1.5.1
nixl-cu12==1.5.1``): this skips without it on a developer's machine, and fails in CI.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.engines.api import GenerateChunk, GenerateRequest
from tests.engines.tiny_llama import build_tiny_llama

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("nixl") is None:
    why = "needs vllm and nixl (scripts/install-deps.sh installs both)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)

pytestmark = pytest.mark.timeout(300)


async def collect(engine: Any, request: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in engine.generate(request)]


async def test_prefill_hands_its_kv_to_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynamoctl.engines.vllm.engine import VllmEngine

    for name, value in {
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "UCX_NET_DEVICES": "lo",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    }.items():
        monkeypatch.setenv(name, value)
    model = build_tiny_llama(tmp_path / "tiny-llama")
    options = {
        "model": str(model),
        "enforce_eager": True,
        "block_size": 32,
        "max_model_len": 1024,
        "kv_cache_memory_bytes": 16 << 20,
        "kv_transfer_config": {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_buffer_device": "cpu",
        },
    }
    engines = []
    try:
        for port in (5611, 5612):  # each engine core reads its side channel at spawn
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
            engine = VllmEngine.from_options(**options)
            engines.append(engine)
            await engine.start()
        prefill, decode = engines
        prompt = list(range(100, 300))
        ask = {"do_remote_decode": True, "do_remote_prefill": False}
        first = await collect(
            prefill, GenerateRequest("p", prompt, 1, temperature=0.0, kv_transfer_params=ask)
        )
        handoff = first[-1].kv_transfer_params
        assert handoff is not None and handoff["do_remote_prefill"] is True
        remote = await collect(
            decode, GenerateRequest("d", prompt, 16, temperature=0.0, ignore_eos=True,
                                    kv_transfer_params=handoff)
        )  # fmt: skip
        local = await collect(
            prefill, GenerateRequest("l", prompt, 16, temperature=0.0, ignore_eos=True)
        )
        assert [t for c in remote for t in c.token_ids] == [t for c in local for t in c.token_ids]
    finally:
        os.environ.pop("VLLM_NIXL_SIDE_CHANNEL_PORT", None)
        for engine in engines:
            await engine.stop()
