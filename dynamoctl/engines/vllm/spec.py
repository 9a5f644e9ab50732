"""vLLM as dynamoctl knows it (:class:`~dynamoctl.engines.spec.EngineSpec`); no vLLM import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.spec import (
    GIB,
    POOL_PORTS,
    EngineSpec,
    GangRank,
    OffloadArgs,
    OffloadRefused,
    OffloadTiers,
    ParallelShape,
    TransferChannel,
    TransferError,
    port_block,
    refuse_offload,
    served_model_args,
    torch_rank_flags,
)

HOST_IP_VARIABLE = "VLLM_HOST_IP"
"""Where vLLM reads a process's own address (``get_ip()``)."""
DP_RPC_PORT = 29550
"""vLLM's ``--data-parallel-rpc-port`` (its own default), for data-parallel gangs."""
NIXL_SIDE_CHANNEL_BASE = 5600
"""vLLM's default NIXL side-channel port, the first of each pool's block."""


def kv_offload(
    offload: OffloadTiers, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    backend = offload.backend or ("native" if gpus else "lmcache")
    refuse_offload(offload, "vllm", "shared_store")
    if backend == "native":
        if not gpus:
            raise OffloadRefused(
                "kv_offload.backend",
                "native offloading refuses vLLM's CPU build (gpus_per_replica: 0); use lmcache",
            )
        if offload.disk_path is not None:
            raise OffloadRefused("kv_offload.disk_path", "needs backend: lmcache on vllm")
        return OffloadArgs(
            args={"kv_offloading_size": offload.host_gib, "kv_offloading_backend": "native"}
        )
    out = OffloadArgs(env={"LMCACHE_TRACK_USAGE": "false"})  # no telemetry posted outside
    if gpus:  # vLLM's own LMCache integration, in the engine's process
        out.args = {"kv_offloading_size": offload.host_gib, "kv_offloading_backend": "lmcache"}
        if offload.disk_path is not None:
            out.env["LMCACHE_LOCAL_DISK"] = f"file://{offload.disk_path}"
            if offload.disk_gib is not None:
                out.env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = f"{offload.disk_gib * GIB / 1e9:g}"
    else:  # the CPU build: an LMCache server the worker starts (engines/vllm/lmcache.py)
        out.args = {"lmcache_l1_gib": offload.host_gib}
        if offload.disk_path is not None:  # the server's file-system L2 tier
            if offload.disk_gib is not None:
                raise OffloadRefused(
                    "kv_offload.disk_gib",
                    "LMCache's file-system tier (vLLM's CPU build) has no size bound; leave "
                    "it unset (the disk_path's free space bounds it)",
                )
            out.args["lmcache_disk_path"] = offload.disk_path
    if offload.disk_path is not None:
        out.paths["kv_offload.disk_path"] = offload.disk_path
    if not offload.disk_offload_filter:
        raise OffloadRefused(
            "kv_offload.disk_offload_filter", "LMCache has no such filter to turn off"
        )
    return out


def kv_channel(role: str, index: int, address: str, args: Mapping[str, Any]) -> TransferChannel:
    """NixlConnector (both roles listen): ``VLLM_NIXL_SIDE_CHANNEL_HOST`` is bound *and*
    advertised, and data-parallel rank ``r`` listens on ``VLLM_NIXL_SIDE_CHANNEL_PORT + r``:
    an instance reserves ``data-parallel-size`` ports."""
    if "kv_transfer_config" not in args:
        return TransferChannel()
    ranks = args.get("data_parallel_size", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= POOL_PORTS:
        raise TransferError(
            f"workers.{role}.engine_args.data-parallel-size: {ranks!r} is not a whole number "
            f"from 1 to {POOL_PORTS}"
        )
    port = port_block("NIXL side-channel", NIXL_SIDE_CHANNEL_BASE, role, index, ranks)
    ports = {"nixl_side_channel" + (f"_dp{r}" if r else ""): port + r for r in range(ranks)}
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": address, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
    return TransferChannel(env=env, ports=ports)


def data_parallel(args: Mapping[str, Any]) -> bool:
    return int(args.get("data_parallel_size", 1)) > 1


def rank_flags(args: Mapping[str, Any], at: GangRank) -> dict[str, Any]:
    """Tensor/pipeline parallel: torch's rendezvous flags; data parallel (DP attention,
    expert parallel): one engine whose DP ranks are spread evenly over the nodes.
    Followers run ``--headless``; ``--nnodes`` needs the mp executor (parallel.py)."""
    flags: dict[str, Any]
    if data_parallel(args):
        local = int(args["data_parallel_size"]) // at.nnodes
        flags = {
            "data_parallel_size_local": local,
            "data_parallel_address": at.leader,
            "data_parallel_rpc_port": at.port,
        }
        if at.rank:
            flags["data_parallel_start_rank"] = at.rank * local
    else:
        flags = torch_rank_flags(args, at)
    if "distributed_executor_backend" not in args:
        flags["distributed_executor_backend"] = "mp"
    if at.rank:
        flags["headless"] = True
    return flags


def parallel_args(role: str, p: ParallelShape, batch_size: int) -> dict[str, Any]:
    args: dict[str, Any] = {"tensor-parallel-size": p.tp}
    if p.pp > 1:
        args["pipeline-parallel-size"] = p.pp
    if p.dp > 1:
        args["data-parallel-size"] = p.dp
    if p.moe_ep > 1:
        args["enable-expert-parallel"] = True
    args["max-num-seqs"] = batch_size
    if role != "agg":
        args["kv-transfer-config"] = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    return args


def tracing(endpoint: str, protocol: str) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM's own spans (``--otlp-traces-endpoint``; its ``llm_request`` span carries the
    queue time, TTFT and token counts) sent to the recipe's collector. vLLM 0.32 reads the
    protocol from the environment only (default gRPC) and posts OTLP/HTTP to the URL as
    given, so the path is added here."""
    url = endpoint if protocol == "grpc" else endpoint.rstrip("/") + "/v1/traces"
    return {"otlp_traces_endpoint": url}, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol}


SPEC = EngineSpec(
    name="vllm",
    adapter="dynamoctl.engines.vllm.engine:VllmEngine.from_options",
    extra="vllm",
    model_args=served_model_args,
    # vLLM 0.32's LoadFormats less ipc_cache (a loader for weights handed over by another
    # process, which nothing here hands over) and mistral (a checkpoint layout, not a way
    # of loading); runai_streamer needs `pip install vllm[runai]`, fastsafetensors and
    # instanttensor their packages and a GPU, modelexpress a Model Express server.
    load_formats=(
        "auto",
        "safetensors",
        "pt",
        "npcache",
        "dummy",
        "fastsafetensors",
        "instanttensor",
        "runai_streamer",
        "runai_streamer_sharded",
        "sharded_state",
        "tensorizer",
        "modelexpress",
    ),
    embed_args={"runner": "pooling"},  # an embedding model's pooler (/v1/embeddings)
    lora_args=lambda max_loras, max_rank: {
        "enable_lora": True,
        "max_loras": max_loras,
        "max_lora_rank": max_rank,
    },
    priority_args={"scheduling_policy": "priority"},  # the adapter negates the priority
    kv_offload=kv_offload,
    kv_channel=kv_channel,
    rank_flags=rank_flags,
    gang_port=lambda args: DP_RPC_PORT if data_parallel(args) else None,
    # arg_utils.py's world size. The long names only: its short options are -tp/-pp/-dp,
    # which an engine_args key (rendered --tp) does not reach: the worker's parser refuses.
    parallel_sizes=(
        ("tensor-parallel-size",),
        ("pipeline-parallel-size",),
        ("data-parallel-size",),
    ),
    short_options={
        "tp": "tensor-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp": "data-parallel-size",
    },
    follower="dynamoctl.engines.vllm.gang:follow_leader",
    host_ip_variable=HOST_IP_VARIABLE,
    enforcement="anything",
    parallel_args=parallel_args,
    tracing=tracing,
)
