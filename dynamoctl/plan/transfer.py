"""KV-transfer side channels: what a worker's engine needs so that a peer on another host
can fetch its KV cache, per engine, decided by the plan (so the dry run shows it).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamoctl.plan.hosts import Host
from dynamoctl.util.registry import Registry

POOL_PORTS = 100
"""Ports each pool has for one kind of side channel (replicas times ports per replica)."""
POOL_BLOCK = {"prefill": 0, "decode": POOL_PORTS, "agg": 2 * POOL_PORTS}
NIXL_SIDE_CHANNEL_BASE = 5600  # vLLM's default, the first of 300
SGLANG_BOOTSTRAP_BASE = 8998  # SGLang's default, the first of 300


class TransferError(ValueError):
    """The pool has more replicas than its side-channel port block; names the field."""


@dataclass(frozen=True)
class TransferChannel:
    """What one worker adds to its command line and environment, and the fixed ports it
    will listen on (for preflight)."""

    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)


def _port_block(base: str, first: int, role: str, index: int, width: int) -> int:
    """The first of ``width`` ports for replica ``index`` of ``role``."""
    if (index + 1) * width > POOL_PORTS:
        raise TransferError(
            f"workers.{role}.replicas: replica {index} needs {base} ports past the "
            f"{POOL_PORTS} a pool has ({width} per replica); use fewer replicas per pool"
        )
    return first + POOL_BLOCK[role] + index * width


def _vllm(role: str, index: int, host: Host, args: Mapping[str, Any]) -> TransferChannel:
    if "kv_transfer_config" not in args:
        return TransferChannel()
    ranks = args.get("data_parallel_size", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= POOL_PORTS:
        raise TransferError(
            f"workers.{role}.engine_args.data-parallel-size: {ranks!r} is not a whole number "
            f"from 1 to {POOL_PORTS}"
        )
    port = _port_block("NIXL side-channel", NIXL_SIDE_CHANNEL_BASE, role, index, ranks)
    ports = {"nixl_side_channel" + (f"_dp{r}" if r else ""): port + r for r in range(ranks)}
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": host.address, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
    return TransferChannel(env=env, ports=ports)


def _sglang(role: str, index: int, host: Host, args: Mapping[str, Any]) -> TransferChannel:
    if "disaggregation_mode" not in args:
        return TransferChannel()
    env = {"SGLANG_HOST_IP": host.address}
    if args["disaggregation_mode"] != "prefill":
        return TransferChannel(env=env)
    port = args.get("disaggregation_bootstrap_port") or _port_block(
        "bootstrap", SGLANG_BOOTSTRAP_BASE, role, index, 1
    )
    return TransferChannel(
        env=env,
        args={"host": host.address, "disaggregation_bootstrap_port": port},
        ports={"bootstrap": port},
    )


def _none(role: str, index: int, host: Host, args: Mapping[str, Any]) -> TransferChannel:
    return TransferChannel()


CHANNELS: Registry[Callable[[str, int, Host, Mapping[str, Any]], TransferChannel]] = Registry(
    "engine"
)
"""Side-channel settings by engine name (every engine the recipe accepts is here)."""
CHANNELS.add("mocker", _none)
CHANNELS.add("vllm", _vllm)
CHANNELS.add("sglang", _sglang)
CHANNELS.add("trtllm", _none)


def transfer_channel(
    engine: str, role: str, index: int, host: Host, args: Mapping[str, Any]
) -> TransferChannel:
    """The side channel of replica ``index`` of pool ``role`` on ``host``; ``args`` are its
    engine arguments (underscored names). Arguments the recipe gives win; so does the
    pool's ``env`` (the plan merges it last)."""
    channel = CHANNELS[engine](role, index, host, args)
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
