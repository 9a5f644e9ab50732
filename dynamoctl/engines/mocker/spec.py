"""The mocker as dynamoctl knows it (:class:`~dynamoctl.engines.spec.EngineSpec`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.spec import (
    GIB,
    EngineSpec,
    ModelFacts,
    OffloadArgs,
    OffloadRefused,
    OffloadTiers,
    refuse_offload,
)

NUM_GPU_BLOCKS = 16384
"""Default KV blocks of the simulated GPU (``num_gpu_blocks``)."""
KV_BYTES_PER_TOKEN = 131072
"""Default bytes of KV cache per token (``kv_bytes_per_token``)."""


def model_args(model: ModelFacts) -> dict[str, Any]:
    # The mocker pretends to be model.name; its tokenizer is shipped with dynamoctl unless
    # the recipe names one, so the zero-infra default downloads nothing.
    return {
        "model": model.name,
        "tokenizer": model.tokenizer or "builtin",
        "block_size": model.block_size,
        "max_model_len": model.context_length,
    }


def kv_offload(
    offload: OffloadTiers, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    refuse_offload(offload, "the mocker", "shared_store", "backend")
    get = {k.replace("-", "_"): v for k, v in engine_args.items()}.get
    block_bytes = block_size * int(get("kv_bytes_per_token", KV_BYTES_PER_TOKEN))
    gpu_blocks = int(get("num_gpu_blocks", NUM_GPU_BLOCKS))
    host_blocks = math.floor(offload.host_gib * GIB / block_bytes)
    if host_blocks < gpu_blocks:
        raise OffloadRefused(
            "kv_offload.host_gib",
            f"{offload.host_gib} GiB ({host_blocks} blocks of {block_bytes} bytes) is "
            f"smaller than the GPU KV cache ({gpu_blocks} blocks = "
            f"{gpu_blocks * block_bytes / GIB:.3g} GiB): it would churn",
        )
    out = OffloadArgs(
        args={"num_host_blocks": host_blocks, "disk_offload_filter": offload.disk_offload_filter}
    )
    if offload.disk_path is not None:
        if offload.disk_gib is None:
            raise OffloadRefused("kv_offload.disk_gib", "is required by the mocker's disk tier")
        out.args["num_disk_blocks"] = math.floor(offload.disk_gib * GIB / block_bytes)
        out.args["disk_path"] = out.paths["kv_offload.disk_path"] = offload.disk_path
    return out


SPEC = EngineSpec(
    name="mocker",
    adapter="dynamoctl.engines.mocker.engine:MockerEngine.from_options",
    model_args=model_args,
    embed_args={"task": "embed"},
    kv_offload=kv_offload,
    # hand-offs travel on the worker's own request plane: no side channel
    follower="dynamoctl.engines.mocker.gang:follow_leader",
    enforcement="generated",
    simulates=True,
    # the mocker "reads" weights_model's config (and safetensors sizes): a cached copy is
    # read at the node's local disk bandwidth
    weights_arg="weights_model",
    cached_weights_args={"weights_source": "local-disk"},
    lora_args=lambda max_loras, max_rank: {"max_loras": max_loras},
    priority_args={"scheduling_policy": "priority"},
)
