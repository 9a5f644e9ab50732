"""Multi-node replicas ("gangs") in the plan: one engine instance over several nodes.

A pool with ``nodes_per_replica`` N > 1 places each replica on N whole nodes
(:meth:`GpuMap.take_nodes <dynamoctl.plan.build.GpuMap.take_nodes>`). The plan stays
flat: every member is an ordinary :class:`InstanceSpec` (launchers, preflight, logs and
``state.json`` are per process), with ``gang``, ``rank`` and ``nnodes`` set. The leader
(node rank 0) keeps the replica's name (``decode-0``, what discovery, the router and
``drain`` know) and runs ``dynamoctl worker``; followers (``decode-0.1`` ..) run
``dynamoctl follower``, which never registers.

Every member gets the rank and rendezvous flags its engine reads (its spec's
``rank_flags``; docs/engines.md, "Multi-node replicas", which cites the engines' launch
code):

- vLLM, tensor/pipeline parallel: ``--nnodes --node-rank --master-addr --master-port``
  (the torch world's TCPStore on the leader) with ``--distributed-executor-backend mp``;
  followers add ``--headless`` (workers only, no API server).
- vLLM, data parallel (``data-parallel-size`` > 1: DP attention, expert parallel): one
  engine whose DP ranks are spread evenly over the nodes: ``--data-parallel-size-local``,
  ``--data-parallel-address`` (the leader), ``--data-parallel-rpc-port``, and on followers
  ``--data-parallel-start-rank`` and ``--headless``.
- SGLang: ``--nnodes --node-rank --dist-init-addr LEADER:PORT``; followers add
  ``--host MEMBER --port 30000`` (SGLang's dummy health check on node ranks >= 1).
- mocker: vLLM's flag names (``--nnodes --node-rank --master-addr --master-port``), so one
  rendering serves both; its followers answer each simulated step (docs/mocker.md).
- TensorRT-LLM: no followers and no rank flags: one instance whose launch is an MPI
  world over all the gang's nodes (``mpi_nodes``; Slurm only), ``trtllm-llmapi-launch``
  in front of the worker command.

Ports are fixed (whole nodes cannot collide) and declared, so preflight checks them; on
a local target every gang shares the one host, so each gets its own port.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from dynamoctl.engines.registry import engine_spec
from dynamoctl.engines.spec import POOL_BLOCK, EngineSpec, GangRank
from dynamoctl.launch.api import InstanceSpec
from dynamoctl.plan.commands import follower_cache_argv
from dynamoctl.plan.context import BASE_ENV, PlanContext, PlanError
from dynamoctl.plan.hosts import Host
from dynamoctl.plan.transfer import TransferError, member_channel
from dynamoctl.plan.worker import engine_arguments, split_env, worker_spec
from dynamoctl.recipe.models import Role
from dynamoctl.supervisor.instance import InstanceName

RENDEZVOUS_TIMEOUT_CAP = 120.0
"""Longest a follower waits for its leader's rendezvous (``start_timeout`` if shorter)."""

Members = list[tuple[Host, list[int]]]
"""A gang's nodes and their GPUs, leader first."""


def rendezvous_port(first: int, role: Role, index: int, shared_host: bool) -> int:
    """The leader's rendezvous port (``first``: the recipe's ``workers.rendezvous_port``)."""
    if not shared_host:
        return first
    return first + POOL_BLOCK[role] + index  # one host shared by every gang


def gang_specs(ctx: PlanContext, role: Role, index: int, members: Members) -> list[InstanceSpec]:
    """The members of replica ``index`` of pool ``role`` on ``members`` (leader first);
    also what ``scale`` adds."""
    pool = ctx.pool(role)
    spec = engine_spec(pool.engine)
    if spec.mpi_launcher is not None:
        return [_mpi_world_spec(ctx, role, index, members, spec.mpi_launcher)]
    nnodes = len(members)
    leader_host = members[0][0]
    shared = len({host.name for host, _ in members}) == 1
    args = engine_arguments(role, pool, ctx.recipe.model)
    # A data-parallel vLLM gang meets at the leader's DP RPC port, any other at its store.
    port = spec.gang_port(args) or rendezvous_port(
        ctx.recipe.workers.rendezvous_port, role, index, shared
    )
    ports = {"rendezvous": port}
    gang = str(InstanceName(role, index))
    leader = worker_spec(
        ctx,
        role,
        index,
        leader_host,
        members[0][1],
        extra_args=spec.rank_flags(args, GangRank(0, nnodes, leader_host.address, port)),
    )
    specs = [
        msgspec.structs.replace(
            leader,
            gang=gang,
            nnodes=nnodes,
            ports={**leader.ports, **ports},
            env=_member_env(spec, leader.env, leader_host),
        )
    ]
    rendezvous = f"{leader_host.address}:{port}"
    for rank, (host, gpus) in enumerate(members[1:], start=1):
        at = GangRank(rank, nnodes, leader_host.address, port, host.address)
        flags = spec.rank_flags(args, at)
        member = _Member(role, index, rank, nnodes, host, gpus)
        specs.append(_follower_spec(ctx, member, args, flags, rendezvous))
    return specs


@dataclass(frozen=True)
class _Member:
    """One follower's place: its replica, node rank and node."""

    role: Role
    index: int
    rank: int
    nnodes: int
    host: Host
    gpus: list[int]

    @property
    def name(self) -> InstanceName:
        return InstanceName(self.role, self.index, self.rank)


def _follower_spec(
    ctx: PlanContext, member: _Member, args: dict[str, Any], flags: dict[str, Any], rendezvous: str
) -> InstanceSpec:
    """A follower: ``dynamoctl follower`` with the engine's arguments and its rank flags,
    ``model.cache``'s flags (it stages its own node, as the leader does); the pool's env
    and secrets (weights need the same token), its node's GPUs."""
    from dynamoctl.wire.engine_args import render_engine_args

    role, index = member.role, member.index
    pool = ctx.pool(role)
    host = member.host
    try:
        channel = member_channel(pool.engine, role, index, host, args, flags)
    except TransferError as exc:
        raise PlanError(str(exc)) from None
    timeout = min(ctx.recipe.supervision.start_timeout, RENDEZVOUS_TIMEOUT_CAP)
    argv = [
        ctx.python,
        *("-m", "dynamoctl", "follower"),
        *("--engine", pool.engine, "--label", str(member.name)),
        *("--rendezvous", rendezvous, "--rendezvous-timeout", f"{timeout:g}"),
        *follower_cache_argv(ctx.recipe),
        "--",
        *render_engine_args({**args, **channel.args, **flags}),
    ]
    plain, hidden = split_env(pool.env)
    env = {**BASE_ENV, **channel.env, **plain}
    if member.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, member.gpus))
    spec = engine_spec(pool.engine)
    ports = {**channel.ports, **spec.follower_ports(flags)}
    return InstanceSpec(
        name=str(member.name),
        pool=role,
        component="follower",
        host=host.name,
        address=host.address,
        ports=ports,
        argv=argv,
        env=_member_env(spec, env, host),
        gpus=member.gpus,
        secrets=hidden,
        gang=str(member.name.leader),
        rank=member.rank,
        nnodes=member.nnodes,
    )


def _mpi_world_spec(
    ctx: PlanContext, role: Role, index: int, members: Members, launcher: str
) -> InstanceSpec:
    """A TensorRT-LLM gang: one instance whose launch is one MPI world over every node of
    ``members`` (``mpi_nodes``), a rank per GPU. ``trtllm-llmapi-launch`` runs the worker
    command on rank 0 (with the MPI environment stripped, beside TensorRT-LLM's MPI
    leader) and TensorRT-LLM's worker loop on every other rank; the engine's parallel
    sizes span the world. It expands its command unquoted (``$task_with_command``), so
    JSON values are rendered without spaces and any other blank is refused."""
    host, gpus = members[0]
    leader = worker_spec(ctx, role, index, host, gpus)
    argv = [launcher, *map(_compact_json, leader.argv)]
    blank = next((arg for arg in argv if any(c.isspace() for c in arg)), None)
    if blank is not None:
        raise PlanError(
            f"workers.{role}: {blank!r} holds a blank, but {launcher} splits the worker "
            "command at blanks; use a path or value without spaces"
        )
    return msgspec.structs.replace(
        leader,
        argv=argv,
        gang=str(InstanceName(role, index)),
        nnodes=len(members),
        mpi_nodes=[node.name for node, _ in members],
        mpi_tasks_per_node=max(len(gpus), 1),
    )


def _compact_json(arg: str) -> str:
    """``{"a": 1, "b": 2}`` as ``{"a":1,"b":2}``; anything else unchanged."""
    if not arg.startswith(("{", "[")):
        return arg
    try:
        return json.dumps(json.loads(arg), separators=(",", ":"))
    except ValueError:
        return arg


def _member_env(spec: EngineSpec, env: dict[str, str], host: Host) -> dict[str, str]:
    # The engines' cross-node message queues connect to get_ip(), which reads this: the
    # member's own address, not whichever interface a multi-homed node reports first.
    variable = spec.host_ip_variable
    return {**env, variable: host.address} if variable else env
