"""SGLang as dynamoctl knows it (:class:`~dynamoctl.engines.spec.EngineSpec`); no SGLang
import."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.spec import (
    GIB,
    EngineSpec,
    GangRank,
    OffloadArgs,
    OffloadRefused,
    OffloadTiers,
    ParallelShape,
    TransferChannel,
    port_block,
    refuse_offload,
    served_model_args,
)

HOST_IP_VARIABLE = "SGLANG_HOST_IP"
"""Where SGLang reads a process's own address (``get_ip()``)."""
FOLLOWER_HEALTH_PORT = 30000
"""A follower's dummy health check (``--port``, SGLang's default); the ports SGLang
derives from ``--dist-init-addr`` lie just above the rendezvous port."""
BOOTSTRAP_BASE = 8998
"""SGLang's default ``--disaggregation-bootstrap-port``, the first of each pool's block."""


def kv_offload(
    offload: OffloadTiers, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    refuse_offload(offload, "sglang", "backend")
    if offload.disk_gib is not None:
        raise OffloadRefused(
            "kv_offload.disk_gib", "SGLang's file store has no size limit; omit it"
        )
    # write_through_selective writes only blocks hit before: SGLang's frequency filter,
    # applied from GPU to host (HiCache backs up host blocks to its store).
    policy = "write_through_selective" if offload.disk_offload_filter else "write_through"
    size_gb = math.floor(offload.host_gib * GIB / 1e9)  # SGLang's --hicache-size: whole GB
    if size_gb < 1:
        raise OffloadRefused(
            "kv_offload.host_gib", "SGLang's hicache_size counts whole GB: >= 0.94"
        )
    out = OffloadArgs(
        args={
            "enable_hierarchical_cache": True,
            "hicache_size": size_gb,
            "hicache_write_policy": policy,
        }
    )
    if offload.disk_path is not None and offload.shared_store is not None:
        raise OffloadRefused(
            "kv_offload.shared_store", "SGLang has one store: a disk or a shared one"
        )
    if offload.disk_path is not None:
        out.args["hicache_storage_backend"] = "file"
        out.env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = offload.disk_path
        out.paths["kv_offload.disk_path"] = offload.disk_path
    elif offload.shared_store is not None:
        out.args["hicache_storage_backend"] = offload.shared_store
    return out


def kv_channel(role: str, index: int, address: str, args: Mapping[str, Any]) -> TransferChannel:
    """``disaggregation-mode``: the prefill server opens its bootstrap server on ``--host``
    and ``--disaggregation-bootstrap-port``; decode learns both from the hand-off. Per-rank
    data sockets bind ``SGLANG_HOST_IP``."""
    if "disaggregation_mode" not in args:
        return TransferChannel()
    env = {HOST_IP_VARIABLE: address}
    if args["disaggregation_mode"] != "prefill":
        return TransferChannel(env=env)
    port = args.get("disaggregation_bootstrap_port") or port_block(
        "bootstrap", BOOTSTRAP_BASE, role, index, 1
    )
    return TransferChannel(
        env=env,
        args={"host": address, "disaggregation_bootstrap_port": port},
        ports={"bootstrap": port},
    )


def rank_flags(args: Mapping[str, Any], at: GangRank) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "nnodes": at.nnodes,
        "node_rank": at.rank,
        "dist_init_addr": f"{at.leader}:{at.port}",
    }
    if at.rank:  # where SGLang's follower serves its dummy health check
        flags |= {"host": at.member, "port": FOLLOWER_HEALTH_PORT}
    return flags


def parallel_args(role: str, p: ParallelShape, batch_size: int) -> dict[str, Any]:
    args: dict[str, Any] = {"tp-size": p.tp * p.dp}  # SGLang's dp-attention lives inside tp
    if p.pp > 1:
        args["pp-size"] = p.pp
    if p.dp > 1:
        args |= {"dp-size": p.dp, "enable-dp-attention": True}
    if p.moe_ep > 1:
        args["ep-size"] = p.moe_ep
    args["max-running-requests"] = batch_size
    return args


SPEC = EngineSpec(
    name="sglang",
    adapter="dynamoctl.engines.sglang.engine:SglangEngine.from_options",
    extra="sglang",
    model_args=served_model_args,
    # SGLang's --load-format choices that read a checkpoint from a path (its documented
    # list; the wheel is not installed here to check against)
    load_formats=("auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "layered"),
    # higher values first, as dynamoctl's (unless schedule_low_priority_values_first)
    priority_args={"enable_priority_scheduling": True},
    kv_offload=kv_offload,
    kv_channel=kv_channel,
    rank_flags=rank_flags,
    # dp-attention lives inside tp
    parallel_sizes=(
        ("tp-size", "tp", "tensor-parallel-size"),
        ("pp-size", "pipeline-parallel-size"),
    ),
    follower="dynamoctl.engines.sglang.gang:follow_leader",
    follower_check="dynamoctl.engines.sglang.gang:follower_server_args",
    follower_ports=lambda flags: {"health": int(flags["port"])},
    host_ip_variable=HOST_IP_VARIABLE,
    enforcement="xgrammar",
    parallel_args=parallel_args,
)
