"""KV-transfer side channels: what a worker's engine needs so that a peer on another host
can fetch its KV cache, decided by the plan (so the dry run shows it) from each engine's
spec (``kv_channel`` in ``engines/<engine>/spec.py``).

Engines default to loopback and to one fixed port per host, which breaks as soon as a
decode worker is on another node than its prefill worker, or two workers share a node:

- **vLLM, NixlConnector** (both roles listen): ``VLLM_NIXL_SIDE_CHANNEL_HOST`` is bound
  *and* advertised in ``kv_transfer_params`` (so it must be the node's address, default
  ``localhost``), and the listener of data-parallel rank ``r`` takes
  ``VLLM_NIXL_SIDE_CHANNEL_PORT + r`` (default 5600): an instance reserves
  ``data-parallel-size`` ports; tensor and pipeline ranks share one listener
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py, vLLM 0.32).
- **SGLang** (``disaggregation-mode``): the prefill server opens the bootstrap server on
  ``--host`` (default 127.0.0.1) and ``--disaggregation-bootstrap-port`` (default 8998);
  decode learns both from the hand-off. Per-rank data sockets bind ``SGLANG_HOST_IP``.
- **TensorRT-LLM**: its cache transceiver binds random ports on an address it picks itself
  (``TRTLLM_UCX_INTERFACE``/``TRTLLM_NIXL_INTERFACE`` name the NIC on multi-NIC nodes: set
  them in the pool's ``env``); nothing to assign.
- **mocker**: hand-offs travel on the worker's own request plane.

Ports are a function of (pool, replica index), so ``scale`` gives a new replica the same
port every time and no two replicas of a deployment share one, whichever nodes they land
on; preflight checks that they are free on their node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.registry import engine_spec
from dynamoctl.engines.spec import TransferChannel
from dynamoctl.engines.spec import TransferError as TransferError  # re-exported: its error
from dynamoctl.plan.hosts import Host


def transfer_channel(
    engine: str, role: str, index: int, host: Host, args: Mapping[str, Any]
) -> TransferChannel:
    """The side channel of replica ``index`` of pool ``role`` on ``host``; ``args`` are its
    engine arguments (underscored names). Arguments the recipe gives win; so does the
    pool's ``env`` (the plan merges it last)."""
    channel = engine_spec(engine).kv_channel(role, index, host.address, args)
    return TransferChannel(
        env=channel.env,
        args={k: v for k, v in channel.args.items() if k not in args},
        ports=channel.ports,
    )


def member_channel(
    engine: str,
    role: str,
    index: int,
    host: Host,
    args: Mapping[str, Any],
    rank_args: Mapping[str, Any],
) -> TransferChannel:
    """The KV side channel of one process (raises :class:`TransferError`). A
    data-parallel gang member runs only its node's ``data-parallel-size-local`` ranks,
    from ``data-parallel-start-rank``: vLLM's rank ``r`` listens on the side-channel port
    plus its *global* DP rank, so every member shares the replica's base port and
    declares (for preflight) only the ports of its own ranks."""
    channel = transfer_channel(engine, role, index, host, args)
    local = rank_args.get("data_parallel_size_local")
    if local is None or not channel.ports:
        return channel
    first = int(rank_args.get("data_parallel_start_rank", 0))
    ports = {
        name: port
        for name, port in channel.ports.items()
        if first <= _dp_rank_of(name) < first + int(local)
    }
    return dataclasses.replace(channel, ports=ports)


def _dp_rank_of(port_name: str) -> int:
    """The data-parallel rank a side-channel port is for (``nixl_side_channel_dp3``: 3)."""
    _, sep, rank = port_name.rpartition("_dp")
    return int(rank) if sep and rank.isdigit() else 0
