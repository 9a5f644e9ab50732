"""Recipe → placement plan: which instance runs on which host, with which GPUs, how.

The plan is a pure function of the recipe, the hosts and the run directory, so
``dynamoctl up --dry-run`` prints the same text every time (golden-file tested), and the
supervisor starts exactly what the dry run showed.

Placement: the head host (first one) runs the managed etcd, the routers and the frontend;
worker replicas go first-fit over hosts in pool order (prefill, decode, agg), each taking
``gpus_per_replica`` contiguous free GPUs (``CUDA_VISIBLE_DEVICES``). Replicas without
GPUs are spread round-robin, so a CPU deployment still uses every host.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from dynamoctl.launch.api import InstanceSpec
from dynamoctl.recipe.models import (
    EmbeddedDiscovery,
    EtcdDiscovery,
    LocalTarget,
    ModelSpec,
    Recipe,
    Role,
    SlurmTarget,
    SshTarget,
    WorkerPool,
)

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
BASE_ENV = {"PYTHONUNBUFFERED": "1"}


class PlanError(ValueError):
    """The recipe cannot be placed on these hosts; the message names the field."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    namespace: str
    target: str
    hosts: list[str]
    discovery_url: str
    endpoint: str
    """The OpenAI base URL clients use."""
    model: str
    instances: list[InstanceSpec]

    def by_pool(self, pool: str) -> list[InstanceSpec]:
        return [spec for spec in self.instances if spec.pool == pool]


# -- per-engine model arguments: a registry, not an if/elif chain ----------------------------


def _mocker_args(model: ModelSpec) -> dict[str, Any]:
    # The mocker pretends to be model.name; its tokenizer is shipped with dynamoctl unless
    # the recipe names one, so the zero-infra default downloads nothing.
    return {
        "model": model.name,
        "tokenizer": model.tokenizer or "builtin",
        "block_size": model.block_size,
        "max_model_len": model.context_length,
    }


def _vllm_like_args(model: ModelSpec) -> dict[str, Any]:
    return {
        "model": model.path,
        "served_model_name": model.name,
        "tokenizer": model.tokenizer,
        "block_size": model.block_size,
        "max_model_len": model.context_length,
    }


MODEL_ARGS: dict[str, Callable[[ModelSpec], dict[str, Any]]] = {
    "mocker": _mocker_args,
    "vllm": _vllm_like_args,
    "sglang": _vllm_like_args,
    "trtllm": _vllm_like_args,
}


def engine_arguments(role: str, pool: WorkerPool, model: ModelSpec) -> dict[str, Any]:
    """The pool's ``engine_args`` plus the model's, refusing contradictions."""
    derived = {k: v for k, v in MODEL_ARGS[pool.engine](model).items() if v is not None}
    merged = dict(derived)
    for key, value in pool.engine_args.items():
        name = key.replace("-", "_")
        if name in derived and derived[name] != value:
            raise PlanError(
                f"workers.{role}.engine_args.{key}: {value!r} contradicts the model section "
                f"({derived[name]!r}); set it in one place"
            )
        merged[name] = value
    return merged


# -- hosts and GPUs ---------------------------------------------------------------------------


def count_local_gpus() -> int:
    """GPUs ``nvidia-smi -L`` lists; 0 when it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def target_hosts(recipe: Recipe, allocation: list[str] | None = None) -> tuple[list[str], int]:
    """Hosts and GPUs per host. Slurm hosts are the allocation's nodes when known, else
    symbolic ``node0..`` (a dry run on a login node)."""
    target = recipe.target
    if isinstance(target, LocalTarget):
        gpus = target.gpus if target.gpus is not None else count_local_gpus()
        return ["localhost"], gpus
    if isinstance(target, SshTarget):
        return list(target.hosts), target.gpus_per_host
    assert isinstance(target, SlurmTarget)
    hosts = allocation or [f"node{i}" for i in range(target.nodes)]
    return hosts, target.gpus_per_node


def bind_address(recipe: Recipe, host: str) -> str:
    """Address a component on ``host`` binds and advertises."""
    return "127.0.0.1" if isinstance(recipe.target, LocalTarget) else host


def python_for(recipe: Recipe) -> str:
    if isinstance(recipe.target, SshTarget):
        return recipe.target.python
    if isinstance(recipe.target, SlurmTarget) and recipe.target.container is not None:
        return "python3"  # the image's interpreter, which has dynamoctl installed
    # Local, and Slurm nodes sharing this environment (a venv on shared storage).
    return sys.executable


# -- the plan ---------------------------------------------------------------------------------


def discovery_url(recipe: Recipe, run_dir: Path, head: str) -> str:
    disc = recipe.discovery
    if isinstance(disc, EmbeddedDiscovery):
        return f"embedded://{disc.path or run_dir / 'discovery'}"
    assert isinstance(disc, EtcdDiscovery)
    if disc.managed:
        return f"etcd://{bind_address(recipe, head)}:{ETCD_CLIENT_PORT}"
    return "etcd://" + ",".join(e.split("://", 1)[1] for e in disc.endpoints)


def _etcd_spec(recipe: Recipe, head: str, data_dir: str) -> InstanceSpec:
    addr = bind_address(recipe, head)
    client, peer = f"http://{addr}:{ETCD_CLIENT_PORT}", f"http://{addr}:{ETCD_PEER_PORT}"
    member = f"dynamoctl-{recipe.name}"
    argv = [
        "etcd",
        f"--name={member}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={member}={peer}",
    ]
    return InstanceSpec(
        name="etcd-0", pool="etcd", component="etcd", host=head, argv=argv, env=dict(BASE_ENV)
    )


def _discovery_args(recipe: Recipe, url: str) -> list[str]:
    return ["--namespace", recipe.namespace, "--discovery", url]


def _common(recipe: Recipe, url: str, label: str, host: str) -> list[str]:
    return [
        *_discovery_args(recipe, url),
        "--host",
        bind_address(recipe, host),
        "--lease-ttl",
        str(recipe.discovery.lease_ttl),
        "--label",
        label,
    ]


def worker_spec(
    recipe: Recipe, role: Role, index: int, host: str, gpus: list[int], url: str
) -> InstanceSpec:
    """Replica ``index`` of pool ``role`` on ``host`` (also what ``scale`` adds)."""
    from dynamoctl.worker.options import render_engine_args

    pool = recipe.workers.pools()[role]
    name = f"{role}-{index}"
    argv = [python_for(recipe), "-m", "dynamoctl", "worker", "--engine", pool.engine]
    argv += ["--role", role, *_common(recipe, url, name, host)]
    argv += render_engine_args(engine_arguments(role, pool, recipe.model))
    env = {**BASE_ENV, **pool.env}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return InstanceSpec(
        name=name, pool=role, component="worker", host=host, argv=argv, env=env, gpus=gpus
    )


def _router_knobs(recipe: Recipe) -> list[str]:
    router = recipe.frontend.router
    return [
        "--router-mode",
        router.mode,
        "--overlap-weight",
        str(router.overlap_weight),
        "--temperature",
        str(router.temperature),
    ]


def _router_spec(recipe: Recipe, index: int, host: str, url: str) -> InstanceSpec:
    """A standalone router replica (``frontend.router.replicas > 0``)."""
    name = f"router-{index}"
    argv = [python_for(recipe), "-m", "dynamoctl", "router", *_common(recipe, url, name, host)]
    argv += _router_knobs(recipe)
    return InstanceSpec(
        name=name, pool="router", component="router", host=host, argv=argv, env=dict(BASE_ENV)
    )


def _frontend_spec(recipe: Recipe, head: str, url: str) -> InstanceSpec:
    argv = [python_for(recipe), "-m", "dynamoctl", "frontend"]
    argv += _discovery_args(recipe, url)
    argv += ["--host", recipe.frontend.host, "--port", str(recipe.frontend.port)]
    argv += ["--lease-ttl", str(recipe.discovery.lease_ttl), "--label", "frontend-0"]
    argv += _router_knobs(recipe)
    router, workers = recipe.frontend.router, recipe.workers
    if router.replicas:
        argv += ["--router", "standalone"]  # ask the router replicas, no embedded router
    if workers.prefill is not None or workers.decode is not None:
        argv += ["--disaggregation", router.disaggregation]
        argv += ["--min-remote-prefill-tokens", str(router.min_remote_prefill_tokens)]
    return InstanceSpec(
        name="frontend-0",
        pool="frontend",
        component="frontend",
        host=head,
        argv=argv,
        env=dict(BASE_ENV),
    )


class GpuMap:
    """Free GPUs per host, handed out first-fit and contiguously."""

    def __init__(self, hosts: list[str], gpus_per_host: int) -> None:
        self.hosts = hosts
        self.gpus_per_host = gpus_per_host
        self.used: dict[str, set[int]] = {host: set() for host in hosts}
        self._next_cpu_host = 0

    def take(self, count: int) -> tuple[str, list[int]] | None:
        if count == 0:  # CPU replicas: round-robin over hosts
            host = self.hosts[self._next_cpu_host % len(self.hosts)]
            self._next_cpu_host += 1
            return host, []
        for host in self.hosts:
            for start in range(self.gpus_per_host - count + 1):
                block = set(range(start, start + count))
                if not block & self.used[host]:
                    self.used[host] |= block
                    return host, sorted(block)
        return None

    def release(self, host: str, gpus: list[int]) -> None:
        self.used[host] -= set(gpus)


def build_plan(
    recipe: Recipe, run_dir: Path, allocation: list[str] | None = None
) -> tuple[Plan, GpuMap]:
    """The plan and the GPU map left after placing it (``scale`` places more later)."""
    hosts, gpus_per_host = target_hosts(recipe, allocation)
    head = hosts[0]
    url = discovery_url(recipe, run_dir, head)
    instances: list[InstanceSpec] = []
    disc = recipe.discovery
    if isinstance(disc, EtcdDiscovery) and disc.managed:
        data_dir = str(run_dir / "etcd") if isinstance(recipe.target, LocalTarget) else ""
        if not data_dir:
            workdir = getattr(recipe.target, "workdir", None)
            data_dir = f"{workdir or '.'}/dynamoctl-{recipe.name}-etcd"
        instances.append(_etcd_spec(recipe, head, data_dir))
    gpu_map = GpuMap(hosts, gpus_per_host)
    roles: tuple[Role, ...] = ("prefill", "decode", "agg")
    for role in roles:
        pool = recipe.workers.pools().get(role)
        if pool is None:
            continue
        for index in range(pool.replicas):
            placed = gpu_map.take(pool.gpus_per_replica)
            if placed is None:
                raise PlanError(
                    f"workers.{role}.gpus_per_replica: replica {index} needs "
                    f"{pool.gpus_per_replica} GPU(s) but the target has {len(hosts)} host(s) "
                    f"with {gpus_per_host} GPU(s) each, already taken by earlier replicas"
                )
            instances.append(worker_spec(recipe, role, index, placed[0], placed[1], url))
    for index in range(recipe.frontend.router.replicas):  # spread, like CPU replicas
        instances.append(_router_spec(recipe, index, hosts[index % len(hosts)], url))
    instances.append(_frontend_spec(recipe, head, url))
    shown_host = "127.0.0.1" if recipe.frontend.host == "0.0.0.0" else recipe.frontend.host
    if not isinstance(recipe.target, LocalTarget) and shown_host == "127.0.0.1":
        shown_host = head
    plan = Plan(
        name=recipe.name,
        namespace=recipe.namespace,
        target=recipe.target.kind,
        hosts=hosts,
        discovery_url=url,
        endpoint=f"http://{shown_host}:{recipe.frontend.port}/v1",
        model=recipe.model.name,
        instances=instances,
    )
    return plan, gpu_map


def render(plan: Plan, describe: Callable[[InstanceSpec], list[str]]) -> str:
    """The dry run's text: every instance, its host, GPUs, environment and command."""
    lines = [
        f"deployment {plan.name} (namespace {plan.namespace}), target {plan.target}, "
        f"hosts {', '.join(plan.hosts)}",
        f"discovery {plan.discovery_url}",
        f"endpoint  {plan.endpoint} (model {plan.model})",
        "",
    ]
    for spec in plan.instances:
        gpus = ",".join(map(str, spec.gpus)) or "-"
        lines.append(f"[{spec.name}] {spec.component} on {spec.host}, gpus {gpus}")
        if spec.env:
            lines.append("  env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items()))
        lines.append("  $ " + shlex.join(describe(spec)))
    return "\n".join(lines) + "\n"
