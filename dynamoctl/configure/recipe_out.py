"""A recommended configuration as a recipe: placed on the target's nodes, built as a
:class:`~dynamoctl.recipe.models.Recipe` (so the schema's rules check it), dumped as YAML
with a comment on each figure saying where it came from (docs/configure.md).
"""

from __future__ import annotations

import io
import math
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from dynamoctl.configure.models import Answer, Candidate, ConfigureError, Pool
from dynamoctl.engines.registry import engine_spec
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget, Target

# -- where replicas go -----------------------------------------------------------------------


def target_shape(target: Target) -> tuple[int, int]:
    """(nodes, GPUs per node) of a target."""
    if isinstance(target, LocalTarget):
        return 1, target.gpus or 0
    if isinstance(target, SshTarget):
        return len(target.hosts), target.gpus_per_host
    assert isinstance(target, SlurmTarget)
    return target.nodes, target.gpus_per_node


def check_gpus(gpus: int, target: Target) -> None:
    """``gpus`` must be what the target's nodes hold, in whole nodes beyond one."""
    nodes, per_node = target_shape(target)
    if per_node < 1:
        raise ConfigureError(f"the {target.kind} target declares no GPUs per node")
    if gpus > nodes * per_node:
        raise ConfigureError(
            f"--gpus {gpus} do not fit the target: {nodes} node(s) x {per_node} GPUs = "
            f"{nodes * per_node}"
        )
    if gpus > per_node and gpus % per_node:
        raise ConfigureError(
            f"--gpus {gpus} is not whole nodes of {per_node} GPUs; use "
            f"{gpus // per_node * per_node} or {math.ceil(gpus / per_node) * per_node}"
        )


def nodes_per_instance(pool: Pool, per_node: int) -> int:
    """Nodes one instance of ``pool`` spans (1 when it fits on a node)."""
    gpus = pool.parallel.gpus
    return 1 if gpus <= per_node else gpus // per_node


def _packs(candidate: Candidate, units: int, nodes: int, per_node: int) -> bool:
    """Whether ``units`` copies of the candidate's unit fit the nodes: multi-node
    instances take whole nodes, the others are packed first-fit, largest first."""
    free = [per_node] * nodes
    sizes: list[int] = []
    for pool in candidate.pools().values():
        sizes += [pool.parallel.gpus] * (pool.workers * units)
    for size in sorted(sizes, reverse=True):
        if size > per_node:
            whole = size // per_node
            empty = [i for i, f in enumerate(free) if f == per_node][:whole]
            if size % per_node or len(empty) < whole:
                return False
            for i in empty:
                free[i] = 0
            continue
        slot = next((i for i, f in enumerate(free) if f >= size), None)
        if slot is None:
            return False
        free[slot] -= size
    return True


def place(candidate: Candidate, target: Target, engine: str) -> int:
    """Units of ``candidate`` the target holds (at most AI Configurator's); 0: none."""
    nodes, per_node = target_shape(target)
    for pool in candidate.pools().values():
        size = pool.parallel.gpus
        spans = engine_spec(engine).configure_spans_nodes
        if size > per_node and (size % per_node or not spans):
            return 0  # a gang takes whole nodes; TensorRT-LLM gangs are not supported yet
    units = candidate.units
    while units and not _packs(candidate, units, nodes, per_node):
        units -= 1
    return units


def choose(answer: Answer, target: Target, mode: str = "best") -> tuple[Candidate, int]:
    """The best configuration the target's nodes hold, and how many units of it: the
    winning mode's by rank, then the other mode's (or only ``mode``'s)."""
    ordered = sorted(answer.candidates, key=lambda c: (c.mode != answer.chosen, c.rank))
    if mode != "best":
        ordered = [c for c in ordered if c.mode == mode]
        if not ordered:
            raise ConfigureError(f"--mode {mode}: no {mode} configuration meets the targets")
    refused = []
    for candidate in ordered:
        units = place(candidate, target, answer.question.engine)
        if units:
            return candidate, units
        refused.append(candidate.label())
    nodes, per_node = target_shape(target)
    raise ConfigureError(
        f"none of the configurations fits {nodes} node(s) of {per_node} GPUs ("
        + "; ".join(refused)
        + "): an instance larger than a node must take whole nodes (and TensorRT-LLM "
        "instances cannot span nodes yet)"
    )


# -- the recipe ------------------------------------------------------------------------------


def engine_args(engine: str, role: str, pool: Pool) -> dict[str, Any]:
    """The ``engine_args`` ``engine`` gets for a pool (its role and shape), from its spec."""
    parallel_args = engine_spec(engine).parallel_args
    if parallel_args is None:
        raise ConfigureError(f"configure has no parallel flags for engine {engine!r}")
    return parallel_args(role, pool.parallel, pool.batch_size)


def build_recipe(
    answer: Answer,
    candidate: Candidate,
    units: int,
    *,
    name: str,
    served_name: str,
    target: Target,
    discovery: dict[str, Any] | None = None,
) -> Recipe:
    """The recipe of ``units`` units of ``candidate`` on ``target``, validated."""
    q = answer.question
    _, per_node = target_shape(target)
    workers: dict[str, Any] = {}
    for role, pool in candidate.pools().items():
        spans = nodes_per_instance(pool, per_node)
        workers[role] = {
            "engine": q.engine,
            "replicas": pool.workers * units,
            "gpus_per_replica": pool.parallel.gpus,
            **({"nodes_per_replica": spans} if spans > 1 else {}),
            "engine_args": engine_args(q.engine, role, pool),
        }
    nodes, _ = target_shape(target)
    if discovery is None:
        many = nodes > 1
        discovery = {"backend": "etcd", "managed": True} if many else {"backend": "embedded"}
    data = {
        "schema": 1,
        "name": name,
        "discovery": discovery,
        "target": target.model_dump(mode="json", exclude_none=True),
        "model": {"name": served_name, "path": answer.question.model},
        "workers": workers,
    }
    if candidate.mode == "disagg":
        data["frontend"] = {"router": {"mode": "kv"}}
    return Recipe.model_validate(data)


def dump_recipe(recipe: Recipe, answer: Answer, candidate: Candidate, units: int) -> str:
    """YAML of ``recipe`` (defaults left out) with where each figure came from; checked
    by loading it back as ``dynamoctl recipe validate`` would."""
    data = recipe.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    data.pop("namespace", None)
    data["workers"] = {  # every pool's shape spelled out, defaults or not
        role: {
            "engine": pool.engine,
            "replicas": pool.replicas,
            "gpus_per_replica": pool.gpus_per_replica,
            **({"nodes_per_replica": pool.nodes_per_replica} if pool.nodes_per_replica > 1 else {}),
            "engine_args": pool.engine_args,
        }
        for role, pool in recipe.workers.pools().items()
    }
    doc = CommentedMap(data)
    q, p = answer.question, candidate.predicted
    doc.yaml_set_start_comment(
        "Written by `dynamoctl configure` from AI Configurator's "
        f"predictions ({q.engine} {answer.engine_version} data on {q.system}).\n"
        f"Workload: ISL {q.isl}, OSL {q.osl}; targets TTFT {q.ttft_ms:g} ms, TPOT "
        f"{q.tpot_ms:g} ms.\n"
        f"Chosen: {candidate.label()} ({answer.verdict()}).\n"
        f"Predicted per unit at concurrency {candidate.concurrency}: TTFT {p.ttft_ms:.0f} ms, "
        f"TPOT {p.tpot_ms:.1f} ms, {p.tokens_per_s_gpu:.1f} tok/s/GPU, "
        f"{p.tokens_per_s_user:.1f} tok/s/user.\n"
        f"Load to reproduce: concurrency {candidate.concurrency * units} over the whole "
        "deployment (docs/configure.md)."
    )
    workers = CommentedMap(doc["workers"])
    doc["workers"] = workers
    for role, pool in candidate.pools().items():
        entry = CommentedMap(workers[role])
        workers[role] = entry
        per_unit = f"{pool.workers} per unit x {units} unit(s)"
        if units < candidate.units:
            per_unit += f" (AI Configurator sized {candidate.units}; the nodes hold {units})"
        entry.yaml_add_eol_comment(per_unit, "replicas")
        entry.yaml_add_eol_comment(
            f"{pool.parallel.label()} = {pool.parallel.gpus} GPUs", "gpus_per_replica"
        )
        args = CommentedMap(entry["engine_args"])
        entry["engine_args"] = args
        first = next(iter(args))
        args.yaml_add_eol_comment("parallel sizes: AI Configurator's search", first)
        batch_key = [k for k in args if k.startswith("max-")]
        if batch_key:
            args.yaml_add_eol_comment("its batch size at the predicted point", batch_key[0])
    out = io.StringIO()
    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.dump(doc, out)
    text = out.getvalue()
    load_recipe_text(text, f"<configured {recipe.name}>")  # what `recipe validate` checks
    return text
