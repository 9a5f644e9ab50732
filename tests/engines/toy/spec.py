"""The toy engine's spec: the one file an engine adds besides its adapter. Its adapter is
the mocker's (the plan never imports an adapter); every other fact is its own, so a plan
that renders them can only have read them here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.spec import (
    EngineSpec,
    GangRank,
    ModelFacts,
    OffloadArgs,
    OffloadTiers,
    TransferChannel,
    port_block,
)

HOST_IP_VARIABLE = "TOY_HOST_IP"
SIDE_CHANNEL_BASE = 7100


def model_args(model: ModelFacts) -> dict[str, Any]:
    return {"checkpoint": model.path, "alias": model.name, "page_size": model.block_size}


def kv_offload(
    offload: OffloadTiers, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    return OffloadArgs(args={"host_cache_gib": offload.host_gib}, env={"TOY_TIERS": "1"})


def kv_channel(role: str, index: int, address: str, args: Mapping[str, Any]) -> TransferChannel:
    port = port_block("toy side-channel", SIDE_CHANNEL_BASE, role, index, 1)
    return TransferChannel(env={"TOY_SIDE_CHANNEL": f"{address}:{port}"}, ports={"toy": port})


def rank_flags(args: Mapping[str, Any], at: GangRank) -> dict[str, Any]:
    return {"world": at.nnodes, "rank": at.rank, "leader": f"{at.leader}:{at.port}"}


SPEC = EngineSpec(
    name="toy",
    adapter="dynamoctl.engines.mocker.engine:MockerEngine.from_options",
    model_args=model_args,
    kv_offload=kv_offload,
    kv_channel=kv_channel,
    rank_flags=rank_flags,
    host_ip_variable=HOST_IP_VARIABLE,
    parallel_sizes=(("toy-parallel",),),
)
