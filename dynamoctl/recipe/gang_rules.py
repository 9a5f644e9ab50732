"""Recipe rules of multi-node replicas (``workers.ROLE.nodes_per_replica`` > 1): the flags
dynamoctl sets for every gang member, and the arithmetic a gang must satisfy. Called from
the models' validators (:mod:`dynamoctl.recipe.models`, :mod:`dynamoctl.recipe.workers`),
whose errors name the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dynamoctl.engines.registry import engine_spec
from dynamoctl.recipe.fields import rule_error
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget, Target


class GangPool(Protocol):
    """What the rules read of a worker pool (:class:`~dynamoctl.recipe.workers.WorkerPool`,
    which calls them: named by its fields, not imported back)."""

    @property
    def engine(self) -> str: ...
    @property
    def engine_args(self) -> Mapping[str, Any]: ...
    @property
    def nodes_per_replica(self) -> int: ...
    @property
    def gpus_per_replica(self) -> int: ...


GANG_FLAGS = frozenset(
    {
        "nnodes",
        "node-rank",
        "master-addr",
        "master-port",
        "headless",
        "dist-init-addr",
        "data-parallel-address",
        "data-parallel-rpc-port",
        "data-parallel-start-rank",
        "data-parallel-size-local",
    }
)
"""Engine flags dynamoctl derives for every member of a gang (never from ``engine_args``)."""


def parallel_product(pool: GangPool) -> tuple[int, list[str]]:
    """The product of the pool's parallel sizes and the ``engine_args`` keys giving them."""

    product, named = 1, []
    args = {key.replace("_", "-"): (key, value) for key, value in pool.engine_args.items()}
    for spellings in engine_spec(pool.engine).parallel_sizes:
        for spelling in spellings:
            if spelling in args:
                key, value = args[spelling]
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise rule_error(f"engine_args.{key}", "must be a whole number >= 1")
                product *= value
                named.append(f"{key} {value}")
                break
    return product, named


def check_gang(role: str, pool: GangPool, target: Target) -> None:
    """A multi-node replica: whole nodes of the target, parallel sizes that fill them."""

    nodes = pool.nodes_per_replica
    at = f"workers.{role}"
    spec = engine_spec(pool.engine)
    if isinstance(target, LocalTarget):
        # One machine: members are processes on it (the mocker's gang, for tests and demos).
        if not spec.simulates or pool.gpus_per_replica != 0:
            raise rule_error(
                f"{at}.nodes_per_replica",
                "a local target has one node: only the mocker (gpus_per_replica: 0) may "
                "simulate a multi-node replica there",
            )
        return
    if spec.mpi_launcher is not None and not isinstance(target, SlurmTarget):
        raise rule_error(
            f"{at}.nodes_per_replica",
            "TensorRT-LLM runs a multi-node replica as one MPI world, which dynamoctl starts "
            "only on a Slurm target (one `srun --mpi=pmix` step over the replica's nodes); "
            "an ssh target has no MPI launcher dynamoctl controls: use nodes_per_replica: 1, "
            "or the vllm or sglang engine",
        )
    have = len(target.hosts) if isinstance(target, SshTarget) else target.nodes
    field = "target.hosts" if isinstance(target, SshTarget) else "target.nodes"
    if nodes > have:
        raise rule_error(
            f"{at}.nodes_per_replica",
            f"{nodes} nodes per replica but the target has {have} ({field})",
        )
    per_node = target.gpus_per_host if isinstance(target, SshTarget) else target.gpus_per_node
    if pool.gpus_per_replica not in (0, nodes * per_node):
        raise rule_error(
            f"{at}.gpus_per_replica",
            f"{pool.gpus_per_replica} but a replica of {nodes} whole nodes has {nodes} x "
            f"{per_node} = {nodes * per_node} GPUs (or 0 on CPU nodes)",
        )
    for key in pool.engine_args:
        long = spec.short_options.get(key)
        if long:
            raise rule_error(
                f"{at}.engine_args.{key}",
                f"vLLM's short option is -{key}, which engine_args cannot give (it renders "
                f"--{key}, which vLLM refuses); write {long}",
            )
    product, named = parallel_product(pool)
    if not named:
        return
    sizes = " x ".join(named)
    if pool.gpus_per_replica and product != pool.gpus_per_replica:
        raise rule_error(
            f"{at}.engine_args.{named[0].split()[0]}",
            f"{sizes} = {product} GPUs but the replica has {nodes} nodes x {per_node} = "
            f"{pool.gpus_per_replica}",
        )
    if not pool.gpus_per_replica and product % nodes:
        raise rule_error(
            f"{at}.engine_args.{named[0].split()[0]}",
            f"{sizes} = {product} ranks cannot be split evenly over {nodes} nodes",
        )
