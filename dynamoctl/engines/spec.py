"""What dynamoctl knows about an engine, in one place per engine (``engines/<engine>/spec.py``).

An :class:`EngineSpec` is plain values and small functions of plain values: the arguments
an engine takes from the recipe's model section, how it gets ``kv_offload``'s tiers, the
rank flags of a gang's members, the variable it reads a member's address from, its KV
side channel, what structured output it can enforce, ``configure``'s parallel flags and
its follower's entry. It imports no engine library and no recipe, plan or configure model
(tests/test_layers.py checks this): the recipe, the plan, ``configure``, the follower and
the frontend read it. :mod:`dynamoctl.engines.registry` lists the specs; adding an engine
is its folder plus one line there (docs/engines.md, "Adding an engine").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dynamoctl.wire.roles import PLACEMENT_ORDER

# -- what a spec reads: the shapes of the recipe's and configure's values --------------------


class ModelFacts(Protocol):
    """The recipe's model section, as far as an engine's arguments go."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def context_length(self) -> int | None: ...
    @property
    def task(self) -> str: ...


class OffloadTiers(Protocol):
    """A pool's ``kv_offload`` section (docs/recipes.md, "KV offload")."""

    @property
    def host_gib(self) -> float: ...
    @property
    def disk_path(self) -> str | None: ...
    @property
    def disk_gib(self) -> float | None: ...
    @property
    def disk_offload_filter(self) -> bool: ...
    @property
    def shared_store(self) -> str | None: ...
    @property
    def backend(self) -> str | None: ...


class ParallelShape(Protocol):
    """How ``configure`` splits one instance over its GPUs."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def moe_ep(self) -> int: ...


# -- what a spec answers ---------------------------------------------------------------------

GIB = 1 << 30


class OffloadRefused(ValueError):
    """An engine cannot honour a ``kv_offload`` setting; ``at`` is the pool's field
    (``kv_offload.disk_path``), the recipe turns it into an error with its line."""

    def __init__(self, at: str, message: str) -> None:
        super().__init__(message)
        self.at = at
        self.message = message


@dataclass
class OffloadArgs:
    """What a pool's engine needs for its tiers."""

    args: dict[str, Any] = field(default_factory=dict)
    """Engine arguments (names as in ``engine_args``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of each replica."""
    paths: dict[str, str] = field(default_factory=dict)
    """Directories each replica writes, by recipe field: checked on its node first."""


def refuse_offload(offload: OffloadTiers, engine: str, *fields: str) -> None:
    """Refuse the ``kv_offload`` fields ``engine`` has no use for, when set."""
    for name in fields:
        if getattr(offload, name) not in (None, True):
            raise OffloadRefused(f"kv_offload.{name}", f"is not supported by {engine}")


class TransferError(ValueError):
    """The pool has more replicas than its side-channel port block; names the field."""


@dataclass(frozen=True)
class TransferChannel:
    """What one worker adds to its command line and environment for its KV side channel,
    and the fixed ports it will listen on (for preflight)."""

    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)


POOL_PORTS = 100
"""Ports each pool has for one kind of fixed port (replicas times ports per replica)."""
POOL_BLOCK: dict[str, int] = {role: i * POOL_PORTS for i, role in enumerate(PLACEMENT_ORDER)}
"""The offset of each pool's block of :data:`POOL_PORTS` ports above a base port: side
channels, and the rendezvous ports of gangs that share one host."""


def port_block(kind: str, first: int, role: str, index: int, width: int) -> int:
    """The first of ``width`` ports of kind ``kind`` (base ``first``) for replica ``index``
    of pool ``role``."""
    if (index + 1) * width > POOL_PORTS:
        raise TransferError(
            f"workers.{role}.replicas: replica {index} needs {kind} ports past the "
            f"{POOL_PORTS} a pool has ({width} per replica); use fewer replicas per pool"
        )
    return first + POOL_BLOCK[role] + index * width


@dataclass(frozen=True)
class GangRank:
    """One member of a multi-node replica: its node rank of ``nnodes``, the leader's
    address and rendezvous port, its own address."""

    rank: int
    nnodes: int
    leader: str
    port: int
    member: str = ""


def torch_rank_flags(args: Mapping[str, Any], at: GangRank) -> dict[str, Any]:
    """torch's rendezvous flags as vLLM names them (the mocker's too): the leader's
    TCPStore."""
    return {
        "nnodes": at.nnodes,
        "node_rank": at.rank,
        "master_addr": at.leader,
        "master_port": at.port,
    }


def no_channel(role: str, index: int, address: str, args: Mapping[str, Any]) -> TransferChannel:
    """An engine whose KV hand-offs need nothing assigned."""
    return TransferChannel()


def no_follower_ports(flags: Mapping[str, Any]) -> dict[str, int]:
    return {}


class LeaderLost(Exception):
    """A follower could not join its leader (an engine's follower side raises it; the
    follower exits with the status of an unreachable leader)."""


FollowerEntry = Callable[[str, str, int, float, Sequence[str]], int]
"""A follower's side: ``(label, leader_address, port, seconds_left, argv) -> exit status``."""


Enforcement = Literal["anything", "xgrammar", "generated"]
"""How an engine enforces structured output: every constraint (vLLM's ``auto`` backend),
through xgrammar (which ignores a few JSON Schema keywords), or by generating an instance
(the mocker): :mod:`dynamoctl.structured.engines` checks a constraint against it."""


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine, as the recipe, the plan, ``configure``, the follower and the frontend
    know it."""

    name: str
    adapter: str
    """``"module:attribute"`` (dotted attribute allowed) of the factory that builds the
    engine in a worker, imported only then."""
    extra: str | None = None
    """The dynamoctl extra that installs the engine (``pip install 'dynamoctl[vllm]'``)."""
    model_args: Callable[[ModelFacts], dict[str, Any]]
    """The engine arguments it takes from the recipe's model section (None: not given)."""
    kv_offload: Callable[[OffloadTiers, int, Mapping[str, Any], int], OffloadArgs]
    """(``kv_offload``, GPUs per replica, the pool's engine_args, block size) → what the
    engine needs for the tiers; raises :class:`OffloadRefused`."""
    kv_channel: Callable[[str, int, str, Mapping[str, Any]], TransferChannel] = no_channel
    """(role, replica index, the worker's address, its engine arguments) → its KV side
    channel; raises :class:`TransferError`."""
    rank_flags: Callable[[Mapping[str, Any], GangRank], dict[str, Any]] = torch_rank_flags
    """The flags a gang member adds to the engine's arguments."""
    gang_port: Callable[[Mapping[str, Any]], int | None] = lambda args: None
    """A fixed port the gang meets at instead of the leader's rendezvous port (vLLM's
    data-parallel RPC port), or None."""
    mpi_launcher: str | None = None
    """A gang is one MPI world started by one launch, this command in front of the worker
    command on every rank (TensorRT-LLM's ``trtllm-llmapi-launch``), not followers."""
    parallel_sizes: tuple[tuple[str, ...], ...] = ()
    """The spellings of each parallel size in ``engine_args``; their product is the GPUs
    one instance uses (a gang's sizes must fill its nodes)."""
    short_options: Mapping[str, str] = field(default_factory=dict)
    """Short parallel options an ``engine_args`` key cannot give, by the long name to use."""
    follower: str | None = None
    """``"module:function"`` of a follower's side (``dynamoctl follower``), a
    :data:`FollowerEntry`; None: the engine has none."""
    follower_check: str | None = None
    """``"module:function"`` that refuses a malformed follower command (``argv``) before
    the follower waits for its leader; None: none."""
    follower_ports: Callable[[Mapping[str, Any]], dict[str, int]] = no_follower_ports
    """Fixed ports a follower listens on, from its rank flags (for preflight)."""
    host_ip_variable: str | None = None
    """Where the engine reads a member's own address (its ``get_ip()``)."""
    enforcement: Enforcement = "anything"
    """What structured output it enforces (:data:`Enforcement`)."""
    simulates: bool = False
    """It simulates a model (and so needs the request's tools and reasoning format to
    shape its output)."""
    parallel_args: Callable[[str, ParallelShape, int], dict[str, Any]] | None = None
    """``configure``: (role, parallel shape, batch size) → the pool's ``engine_args``;
    None: ``configure`` has no data for the engine."""
    configure_spans_nodes: bool = True
    """``configure`` may place an instance over several nodes."""
    load_formats: tuple[str, ...] = ()
    """Weight loaders a pool's ``load_format`` may name: the engine's ``--load-format``
    choices in the pinned version (docs/engines.md, "Weight loaders"); empty: none
    selectable (the recipe refuses the field by name)."""
    load_format_args: Callable[[str], dict[str, Any]] = lambda name: {"load_format": name}
    """A ``load_format`` as engine arguments (vLLM's name, which the other adapters read
    too)."""
    weights_arg: str | None = "model"
    """The engine argument naming the weights directory, which a node's model cache
    points at its local copy (docs/operations.md, "Model cache"); None: nothing to
    stage."""
    cached_weights_args: Mapping[str, Any] = field(default_factory=dict)
    """Arguments added when the weights come from the node's cache (the mocker's read
    bandwidth)."""
    embed_args: Mapping[str, Any] | None = None
    """The engine arguments that run an embedding model (recipe ``model.task: embed``:
    vLLM's pooling runner); None: the engine serves no embeddings."""
    lora_args: Callable[[int, int], dict[str, Any]] | None = None
    """A pool's ``lora`` section (most adapters at once, largest rank) as engine
    arguments (vLLM's ``--enable-lora --max-loras --max-lora-rank``); None: the engine
    serves no LoRA adapters through dynamoctl (the recipe refuses the section by name)."""
    priority_args: Mapping[str, Any] | None = None
    """The engine arguments that make it schedule by each request's
    :attr:`~dynamoctl.wire.engine.GenerateRequest.priority` (a pool's
    ``priority_scheduling``: vLLM's ``--scheduling-policy priority``); None: it has no
    priority scheduling (the recipe refuses the field by name)."""
    tracing: Callable[[str, str], tuple[dict[str, Any], dict[str, str]]] | None = None
    """(the recipe's ``tracing.endpoint``, its OTLP protocol) → the engine arguments and
    environment that make the engine export spans of its own there, under the worker's
    (the adapter hands it each request's ``trace_context``); None: the engine has no
    tracing of its own, the worker's spans alone cover it."""


def load_entry(target: str) -> Any:
    """The object ``"module:attribute"`` names (dotted attribute allowed), imported now."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def served_model_args(model: ModelFacts) -> dict[str, Any]:
    """The model arguments of an engine that loads ``path`` and serves it as ``name``
    (vLLM's names, which SGLang and TensorRT-LLM adapters read too)."""
    return {
        "model": model.path,
        "served_model_name": model.name,
        "tokenizer": model.tokenizer,
        "block_size": model.block_size,
        "max_model_len": model.context_length,
    }
