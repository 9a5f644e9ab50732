"""TensorRT-LLM as dynamoctl knows it (:class:`~dynamoctl.engines.spec.EngineSpec`); no
TensorRT-LLM import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.spec import (
    GIB,
    EngineSpec,
    OffloadArgs,
    OffloadRefused,
    OffloadTiers,
    ParallelShape,
    refuse_offload,
    served_model_args,
)


def kv_offload(
    offload: OffloadTiers, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    refuse_offload(offload, "trtllm", "disk_path", "shared_store", "backend")
    if not offload.disk_offload_filter:
        raise OffloadRefused("kv_offload.disk_offload_filter", "applies to a disk tier only")
    cache = dict(engine_args.get("kv_cache_config") or {})
    size = int(offload.host_gib * GIB)
    if cache.get("host_cache_size", size) != size:
        raise OffloadRefused(
            "engine_args.kv_cache_config",
            "host_cache_size contradicts kv_offload.host_gib; set it in one place",
        )
    cache["host_cache_size"] = size  # bytes of host memory for secondary KV blocks
    return OffloadArgs(args={"kv_cache_config": cache})


def parallel_args(role: str, p: ParallelShape, batch_size: int) -> dict[str, Any]:
    args: dict[str, Any] = {"tensor-parallel-size": p.tp}
    if p.pp > 1:
        args["pipeline-parallel-size"] = p.pp
    if p.moe_ep > 1:
        args["moe-expert-parallel-size"] = p.moe_ep
    args["max-batch-size"] = batch_size
    return args


SPEC = EngineSpec(
    name="trtllm",
    adapter="dynamoctl.engines.trtllm.engine:TrtllmEngine.from_options",
    extra="trtllm",
    model_args=served_model_args,
    load_formats=("auto", "dummy"),  # the LLM API's LoadFormat
    kv_offload=kv_offload,
    # its cache transceiver binds ports it picks itself (TRTLLM_UCX_INTERFACE names the
    # NIC on multi-NIC nodes: the pool's env): no side channel to assign
    parallel_sizes=(("tensor-parallel-size", "tp-size"), ("pipeline-parallel-size", "pp-size")),
    mpi_launcher="trtllm-llmapi-launch",  # its multi-node LLM-API launcher, on every rank
    enforcement="xgrammar",
    parallel_args=parallel_args,
    configure_spans_nodes=False,  # configure does not place TensorRT-LLM gangs yet
)
