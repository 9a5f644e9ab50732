"""One worker replica in the plan: its engine arguments (the pool's, the model's and
``kv_offload``'s, refusing contradictions), its environment and secrets, its command line.
What :mod:`.plan` places and :mod:`.gang_plan` makes the members of a gang from.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynamoctl.engines.registry import engine_spec
from dynamoctl.engines.spec import OffloadArgs
from dynamoctl.launch.api import InstanceSpec, SecretRef
from dynamoctl.plan.commands import worker_argv
from dynamoctl.plan.hosts import Host
from dynamoctl.plan.transfer import TransferError, member_channel
from dynamoctl.recipe.kv_offload import offload_args
from dynamoctl.recipe.models import ModelSpec, Recipe, Role, SecretSource, WorkerPool
from dynamoctl.recipe.targets import SlurmTarget, SshTarget
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.instance import InstanceName

BASE_ENV = {"PYTHONUNBUFFERED": "1"}
"""The environment every process of the plan gets (logs reach the keeper line by line)."""


class PlanError(ValueError):
    """The recipe cannot be placed on these hosts; the message names the field."""


def engine_arguments(role: str, pool: WorkerPool, model: ModelSpec) -> dict[str, Any]:
    """The pool's ``engine_args`` plus the model's and ``kv_offload``'s, refusing
    contradictions."""
    model_args = engine_spec(pool.engine).model_args(model)
    derived = {k: v for k, v in model_args.items() if v is not None}
    offload = _offload(pool, model).args
    merged = dict(derived)
    for key, value in pool.engine_args.items():
        name = key.replace("-", "_")
        for section, theirs in (("the model section", derived), ("kv_offload", offload)):
            if name in theirs and not _agrees(value, theirs[name]):
                raise PlanError(
                    f"workers.{role}.engine_args.{key}: {value!r} contradicts {section} "
                    f"({theirs[name]!r}); set it in one place"
                )
        merged[name] = value
    return {**merged, **offload}


def _offload(pool: WorkerPool, model: ModelSpec) -> OffloadArgs:
    return offload_args(
        pool.engine, pool.kv_offload, pool.gpus_per_replica, pool.engine_args, model.block_size
    )


def _agrees(ours: Any, derived: Any) -> bool:
    """``derived`` is ``ours``, or a mapping that extends it (kv_offload adds to a dict)."""
    if isinstance(ours, dict) and isinstance(derived, dict):
        return all(derived.get(k) == v for k, v in ours.items())
    return bool(ours == derived)


def python_for(recipe: Recipe) -> str:
    if isinstance(recipe.target, SshTarget):
        return recipe.target.python
    if isinstance(recipe.target, SlurmTarget) and recipe.target.container is not None:
        return "python3"  # the image's interpreter, which has dynamoctl installed
    # Local, and Slurm nodes sharing this environment (a venv on shared storage).
    return sys.executable


def component_env(recipe: Recipe, run_dir: Path) -> tuple[dict[str, str], dict[str, SecretRef]]:
    """Environment and secrets every worker, router and frontend gets."""
    env = {**BASE_ENV, **credentials.component_env(recipe)}
    return env, credentials.component_secrets(recipe, run_dir)


def _split_env(
    values: Mapping[str, str | SecretSource],
) -> tuple[dict[str, str], dict[str, SecretRef]]:
    """A pool's ``env``: plain values, and secrets by reference (never values)."""
    plain = {k: v for k, v in values.items() if isinstance(v, str)}
    hidden = {
        k: credentials.secret_ref(v) for k, v in values.items() if isinstance(v, SecretSource)
    }
    return plain, hidden


def worker_spec(
    recipe: Recipe,
    role: Role,
    index: int,
    host: Host,
    gpus: list[int],
    url: str,
    run_dir: Path,
    extra_args: Mapping[str, Any] = {},
) -> InstanceSpec:
    """Replica ``index`` of pool ``role`` on ``host`` (also what ``scale`` adds);
    ``extra_args``: a gang leader's rank flags (:mod:`~dynamoctl.plan.gang`)."""
    from dynamoctl.wire.engine_args import render_engine_args

    pool = recipe.workers.pools()[role]
    name = str(InstanceName(role, index))
    argv = [
        python_for(recipe),
        "-m",
        "dynamoctl",
        *worker_argv(recipe, role, name, host.address, url),
    ]
    args = engine_arguments(role, pool, recipe.model)
    try:
        channel = member_channel(pool.engine, role, index, host, args, extra_args)
    except TransferError as exc:
        raise PlanError(str(exc)) from None
    argv += render_engine_args({**args, **channel.args, **extra_args})
    common, secrets = component_env(recipe, run_dir)
    plain, hidden = _split_env(pool.env)
    offload = _offload(pool, recipe.model)
    env = {**common, **channel.env, **offload.env, **plain}
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
