"""A recipe's ``workers`` section: the worker pools by role (``agg``, or ``prefill`` and
``decode``), each a set of identical engine replicas."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from dynamoctl.engines import registry
from dynamoctl.recipe.fields import NonEmptyStr, OneOf, Port, RecipeModel, rule_error
from dynamoctl.recipe.gang_rules import GANG_FLAGS
from dynamoctl.recipe.kv_offload import KvOffload
from dynamoctl.recipe.lora import Lora
from dynamoctl.recipe.security import EnvValue
from dynamoctl.settings import Role

_ENGINES = OneOf(lambda: registry.ENGINES.names())
EngineName = Annotated[str, _ENGINES, AfterValidator(_ENGINES)]
"""An engine registered in :mod:`dynamoctl.engines.registry` (its names, not a copy)."""


class WorkerPool(RecipeModel):
    """A set of identical engine replicas in one role."""

    engine: EngineName
    """Engine adapter: ``mocker`` (simulated, no GPU), ``vllm``, ``sglang`` or ``trtllm``."""
    replicas: int = Field(default=1, ge=0, le=1024)
    """Number of replicas; 0 declares the pool with nothing running (``dynamoctl scale``
    changes it later). At most 1024, each a process the supervisor probes every
    ``probe_interval``."""
    spares: int = Field(default=0, ge=0, le=64)
    """Warm spares kept beside the replicas: started and ready, but out of routing
    (``STANDBY`` in ``status``), so that ``scale`` up, or the replacement of a replica that
    failed, is a promotion in about a second instead of a start; a promoted spare is
    replaced in the background (docs/operations.md, "Warm spares"). Each holds what a
    replica holds (GPUs, memory). Replicas on one node only (``nodes_per_replica: 1``)."""
    gpus_per_replica: int = Field(default=1, ge=0, le=4096)
    """GPUs each replica gets, over all its nodes; 0 for the mocker or CPU engines. With
    ``nodes_per_replica`` > 1 it must be that many whole nodes' GPUs."""
    nodes_per_replica: int = Field(default=1, ge=1, le=64)
    """Nodes one replica (one engine instance) spans: a *gang* of a leader (node rank 0,
    the only member that registers and serves) and followers, started, restarted and
    stopped together (docs/operations.md, "Multi-node replicas"). Each member takes a whole
    node; dynamoctl gives each the engine's rank and rendezvous flags (vLLM ``--nnodes
    --node-rank --master-addr --master-port``, ``--headless`` on followers; SGLang
    ``--nnodes --node-rank --dist-init-addr``), and the engine's parallel sizes in
    ``engine_args`` must multiply to ``gpus_per_replica``. Engines: vllm, sglang, mocker;
    trtllm on a Slurm target only, as one MPI world (one ``srun --mpi=pmix`` step over
    the replica's nodes running ``trtllm-llmapi-launch``). At most 64 nodes."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Engine command-line arguments without the leading ``--``, passed untouched, e.g.
    ``{tensor-parallel-size: 8}``; ``true`` is a bare flag."""
    kv_offload: KvOffload | None = None
    """KV cache tiers below GPU memory (host memory, local disk, a shared store), set up
    for the pool's engine (docs/recipes.md, "KV offload"). Default: none."""
    load_format: NonEmptyStr | None = None
    """How the engine loads its weights, by the engine's own name (vLLM's and SGLang's
    ``--load-format``: ``runai_streamer`` streams safetensors with parallel reads,
    ``safetensors``, ``dummy`` random weights...); refused by name when the engine has no
    such loader (docs/engines.md, "Weight loaders"). Default: the engine's (``auto``)."""
    lora: Lora | None = None
    """LoRA adapters served beside the base model, each a model name of its own
    (docs/api.md, "LoRA adapters"); refused by name for an engine dynamoctl cannot give
    adapters. Default: none."""
    priority_scheduling: bool = False
    """Start the engine scheduling by priority (vLLM ``--scheduling-policy priority``,
    SGLang ``--enable-priority-scheduling``, the mocker's ``scheduling_policy:
    priority``): each request carries its key's class ``priority`` (docs/security.md,
    "Priority classes") and the engine admits higher ones first, so that an interactive
    request does not wait behind batch prefills inside the worker. Refused by name for
    an engine without it (trtllm)."""
    env: dict[str, EnvValue] = Field(default_factory=dict)
    """Extra environment variables for each replica. A secret (a token, a password) is
    referenced rather than written: ``HF_TOKEN: {from_env: HF_TOKEN}`` or ``{from_file:
    ~/.hf_token}``; it is then read on the supervisor's host when the replica starts and
    delivered without a command line, and the dry run shows ``<from env HF_TOKEN>``."""

    @model_validator(mode="after")
    def _known_load_format(self) -> WorkerPool:
        offered = registry.engine_spec(self.engine).load_formats
        if self.load_format is not None and self.load_format not in offered:
            raise rule_error(
                "load_format",
                f"{self.load_format!r} is not a loader of {self.engine}"
                + (f" (it has: {', '.join(offered)})" if offered else " (it has none to pick)"),
            )
        return self

    @model_validator(mode="after")
    def _engine_serves_lora(self) -> WorkerPool:
        if self.lora is not None and registry.engine_spec(self.engine).lora_args is None:
            raise rule_error(
                "lora",
                f"{self.engine} adapters are not served through dynamoctl yet (vllm and "
                "the mocker are); serve the merged model instead",
            )
        return self

    @model_validator(mode="after")
    def _engine_schedules_by_priority(self) -> WorkerPool:
        if self.priority_scheduling and registry.engine_spec(self.engine).priority_args is None:
            raise rule_error(
                "priority_scheduling",
                f"{self.engine} has no priority scheduling dynamoctl can turn on (vllm, "
                "sglang and the mocker have)",
            )
        return self

    @model_validator(mode="after")
    def _gang_flags_are_ours(self) -> WorkerPool:
        if self.spares and self.nodes_per_replica > 1:
            raise rule_error(
                "spares",
                "is for replicas on one node; a multi-node replica has no spares: a spare "
                f"gang would hold {self.nodes_per_replica} whole nodes idle, and promotion "
                "registers one standby worker, while a gang's leader and followers start "
                "and restart together (scale such a pool instead)",
            )
        if self.nodes_per_replica == 1:
            return self
        for key in self.engine_args:
            if key.replace("_", "-") in GANG_FLAGS:
                raise rule_error(
                    f"engine_args.{key}",
                    "is set by dynamoctl for each member of a multi-node replica (from "
                    "nodes_per_replica and the placement); remove it",
                )
        return self


class Workers(RecipeModel):
    """Worker pools. Either aggregated (``agg``: each replica prefills and decodes) or
    disaggregated (``prefill`` and ``decode``, KV moved between them). Mixing ``agg`` with
    the other two is rejected. ``decode`` alone is allowed: decode workers then prefill
    locally until prefill replicas are scaled up."""

    agg: WorkerPool | None = None
    """Aggregated pool: prefill and decode on the same replica."""
    prefill: WorkerPool | None = None
    """Prefill pool of a disaggregated deployment; needs ``decode``."""
    decode: WorkerPool | None = None
    """Decode pool of a disaggregated deployment."""
    rendezvous_port: Port = 29501
    """Where a multi-node replica's members meet: the leader's port (vLLM's
    ``--master-port``, SGLang's ``--dist-init-addr`` port, the mocker's step channel).
    Gangs whose members all share one host take ports above it, one per replica
    (``rendezvous_port`` + 0, 100 or 200 for a prefill, decode or agg pool + the replica
    index). Change it when two deployments' gangs share a host; preflight names a busy
    one."""

    def pools(self) -> dict[Role, WorkerPool]:
        """The declared pools by role, in the order agg, prefill, decode."""
        declared: dict[Role, WorkerPool | None] = {
            "agg": self.agg,
            "prefill": self.prefill,
            "decode": self.decode,
        }
        return {role: pool for role, pool in declared.items() if pool is not None}

    @model_validator(mode="after")
    def _coherent_roles(self) -> Workers:
        if self.agg is not None and (self.prefill is not None or self.decode is not None):
            mixed = "prefill" if self.prefill is not None else "decode"
            raise rule_error(
                mixed, "cannot be combined with agg; use either agg or prefill + decode"
            )
        if self.prefill is not None and self.decode is None:
            raise rule_error("prefill", "needs a decode pool (add workers.decode)")
        if not any(pool.replicas > 0 for pool in self.pools().values()):
            raise rule_error("", "needs at least one pool (agg, prefill, decode) with replicas > 0")
        return self
