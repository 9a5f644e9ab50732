"""One worker replica in the plan: its engine arguments (the pool's, the model's and
``kv_offload``'s, refusing contradictions), its environment and secrets, its command line.
What :mod:`.build` places and :mod:`.gang` makes the members of a gang from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamoctl.engines.registry import engine_spec
from dynamoctl.engines.spec import OffloadArgs
from dynamoctl.launch.api import InstanceSpec, SecretRef
from dynamoctl.plan.commands import worker_argv
from dynamoctl.plan.context import PlanContext, PlanError
from dynamoctl.plan.hosts import Host
from dynamoctl.plan.transfer import TransferError, member_channel
from dynamoctl.recipe.kv_offload import offload_args
from dynamoctl.recipe.models import ModelSpec, Role
from dynamoctl.recipe.security import SecretSource
from dynamoctl.recipe.tracing import Tracing
from dynamoctl.recipe.workers import WorkerPool
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.instance import InstanceName


def engine_arguments(role: str, pool: WorkerPool, model: ModelSpec) -> dict[str, Any]:
    """The pool's ``engine_args`` plus the model's and ``kv_offload``'s, refusing
    contradictions."""
    spec = engine_spec(pool.engine)
    model_args = spec.model_args(model)
    if model.task == "embed" and spec.embed_args is not None:  # the recipe checked it
        model_args = {**model_args, **spec.embed_args}
    derived = {k: v for k, v in model_args.items() if v is not None}
    offload = _offload(pool, model).args
    loader = spec.load_format_args(pool.load_format) if pool.load_format else {}
    lora = pool.lora
    adapters = spec.lora_args(lora.max_loras, lora.max_rank) if lora and spec.lora_args else {}
    ordered = dict(spec.priority_args or {}) if pool.priority_scheduling else {}
    merged = {**derived, **loader, **adapters, **ordered}
    sections = (
        ("the model section", derived), ("kv_offload", offload), ("load_format", loader),
        ("lora", adapters), ("priority_scheduling", ordered),
    )  # fmt: skip
    for key, value in pool.engine_args.items():
        name = key.replace("-", "_")
        for section, theirs in sections:
            if name in theirs and not _agrees(value, theirs[name]):
                raise PlanError(
                    f"workers.{role}.engine_args.{key}: {value!r} contradicts {section} "
                    f"({theirs[name]!r}); set it in one place"
                )
        merged[name] = value
    return {**merged, **offload}


def _engine_tracing(
    pool: WorkerPool, traced: Tracing | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine's own tracing (:attr:`EngineSpec.tracing`) when the recipe traces and
    the pool's ``engine_args`` do not set it themselves."""
    spec = engine_spec(pool.engine)
    if traced is None or traced.endpoint is None or spec.tracing is None:
        return {}, {}
    args, env = spec.tracing(traced.endpoint, traced.protocol)
    given = {key.replace("-", "_") for key in pool.engine_args}
    return {k: v for k, v in args.items() if k not in given}, env


def _offload(pool: WorkerPool, model: ModelSpec) -> OffloadArgs:
    return offload_args(
        pool.engine, pool.kv_offload, pool.gpus_per_replica, pool.engine_args, model.block_size
    )


def _agrees(ours: Any, derived: Any) -> bool:
    """``derived`` is ``ours``, or a mapping that extends it (kv_offload adds to a dict)."""
    if isinstance(ours, dict) and isinstance(derived, dict):
        return all(derived.get(k) == v for k, v in ours.items())
    return bool(ours == derived)


def split_env(
    values: Mapping[str, str | SecretSource],
) -> tuple[dict[str, str], dict[str, SecretRef]]:
    """A pool's ``env``: plain values, and secrets by reference (never values)."""
    plain = {k: v for k, v in values.items() if isinstance(v, str)}
    hidden = {
        k: credentials.secret_ref(v) for k, v in values.items() if isinstance(v, SecretSource)
    }
    return plain, hidden


def worker_spec(
    ctx: PlanContext,
    role: Role,
    index: int,
    host: Host,
    gpus: list[int],
    extra_args: Mapping[str, Any] = {},
) -> InstanceSpec:
    """Replica ``index`` of pool ``role`` on ``host`` (also what ``scale`` adds);
    ``extra_args``: a gang leader's rank flags (:mod:`~dynamoctl.plan.gang`)."""
    from dynamoctl.wire.engine_args import render_engine_args

    recipe = ctx.recipe
    pool = ctx.pool(role)
    name = str(InstanceName(role, index))
    argv = [
        ctx.python,
        "-m",
        "dynamoctl",
        *worker_argv(recipe, role, name, host.address, ctx.discovery_url),
    ]
    args = engine_arguments(role, pool, recipe.model)
    try:
        channel = member_channel(pool.engine, role, index, host, args, extra_args)
    except TransferError as exc:
        raise PlanError(str(exc)) from None
    traced, traced_env = _engine_tracing(pool, recipe.tracing)
    argv += render_engine_args({**args, **traced, **channel.args, **extra_args})
    common, secrets = ctx.component_env()
    plain, hidden = split_env(pool.env)
    offload = _offload(pool, recipe.model)
    env = {**common, **channel.env, **offload.env, **traced_env, **plain}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return InstanceSpec(
        name=name,
        pool=role,
        component="worker",
        host=host.name,
        address=host.address,
        ports=channel.ports,
        argv=argv,
        env=env,
        gpus=gpus,
        secrets={**secrets, **hidden},
        paths=offload.paths,
    )
