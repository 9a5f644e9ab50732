"""Recipe → placement plan: which instance runs on which host, with which GPUs, how.

The plan is a pure function of the recipe, the hosts and the run directory, so
``dynamoctl up --dry-run`` prints the same text every time (golden-file tested), and the
supervisor starts exactly what the dry run showed.

Placement: the head host (first one) runs the managed etcd, the frontend and the planner
(when the recipe has one); router replicas are spread over the hosts; worker replicas go
first-fit over hosts in pool order (prefill, decode, agg), each taking
``gpus_per_replica`` contiguous free GPUs (``CUDA_VISIBLE_DEVICES``). Replicas without
GPUs are spread round-robin, so a CPU deployment still uses every host.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

from dynamoctl.launch.api import InstanceSpec, SecretRef
from dynamoctl.plan.commands import frontend_argv, planner_argv, router_argv
from dynamoctl.plan.context import (
    BASE_ENV,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    PlanContext,
    target_hosts,
)
from dynamoctl.plan.context import PlanError as PlanError  # re-exported: its error
from dynamoctl.plan.gang import gang_specs
from dynamoctl.plan.gpu_map import GpuMap as GpuMap  # re-exported: the plan's result
from dynamoctl.plan.hosts import Host
from dynamoctl.plan.placed import Plan as Plan  # re-exported: the plan's type
from dynamoctl.plan.worker import worker_spec
from dynamoctl.recipe.discovery import EtcdDiscovery
from dynamoctl.recipe.models import Recipe, Role
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.instance import InstanceName
from dynamoctl.wire.roles import PLACEMENT_ORDER

# -- the plan ---------------------------------------------------------------------------------


def _etcd_spec(ctx: PlanContext) -> InstanceSpec:
    """etcd listens on the head's address (it refuses names there) and advertises its
    name; the peer URLs stay addresses, since etcd matches them against each other.
    With TLS it starts through the wrapper that writes its certificate next to its data
    (:mod:`dynamoctl.discovery.etcd_server`), from secrets."""
    recipe, head = ctx.recipe, ctx.head
    # Local and Slurm: the run directory (on storage the nodes share, under Slurm); SSH:
    # the remote working directory.
    data_dir = recipe.target.etcd_data_dir(ctx.run_dir, recipe.name)
    tls = credentials.managed_etcd_tls(recipe)
    scheme = "https" if tls else "http"
    listen = f"{scheme}://{head.address}:{ETCD_CLIENT_PORT}"
    peer = f"{scheme}://{head.address}:{ETCD_PEER_PORT}"
    member = f"dynamoctl-{recipe.name}"
    wrapper = [ctx.python, "-m", "dynamoctl.discovery.etcd_server", f"{data_dir}-tls"]
    argv = [
        *(wrapper if tls else []),
        "etcd",
        f"--name={member}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={listen}",
        f"--advertise-client-urls={scheme}://{head.name}:{ETCD_CLIENT_PORT}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={member}={peer}",
    ]
    return InstanceSpec(
        name=str(InstanceName("etcd", 0)),
        pool="etcd",
        component="etcd",
        host=head.name,
        address=head.address,
        ports={"client": ETCD_CLIENT_PORT, "peer": ETCD_PEER_PORT},
        argv=argv,
        env=dict(BASE_ENV),
        secrets=credentials.etcd_secrets(ctx.run_dir) if tls else {},
    )


def _component_spec(
    ctx: PlanContext,
    name: InstanceName,
    host: Host,
    argv: list[str],
    *,
    address: str = "",
    ports: Mapping[str, int] = {},
    secrets: Mapping[str, SecretRef] = {},
) -> InstanceSpec:
    """A router, frontend or planner instance: ``python -m dynamoctl ARGV`` on ``host``
    (bound to ``address``, by default the host's), with the components' common environment
    and secrets plus ``secrets``."""
    env, common = ctx.component_env()
    return InstanceSpec(
        name=str(name),
        pool=name.pool,
        component=name.pool,
        host=host.name,
        address=address or host.address,
        ports=dict(ports),
        argv=[ctx.python, "-m", "dynamoctl", *argv],
        env=env,
        secrets={**common, **secrets},
    )


def _router_spec(ctx: PlanContext, index: int) -> InstanceSpec:
    """A standalone router replica (``frontend.router.replicas > 0``), spread over the
    hosts like CPU replicas."""
    name = InstanceName("router", index)
    host = ctx.hosts[index % len(ctx.hosts)]
    argv = router_argv(ctx.recipe, str(name), host.address, ctx.discovery_url)
    return _component_spec(ctx, name, host, argv)


def _planner_spec(ctx: PlanContext) -> InstanceSpec:
    """The SLA planner (a ``planner:`` section), on the head host beside the frontend; it
    alone gets the control endpoint's token (its ``scale`` requests)."""
    name = InstanceName("planner", 0)
    argv = planner_argv(ctx.recipe, str(name), ctx.head.address, ctx.discovery_url)
    token = credentials.planner_secrets(ctx.run_dir)
    return _component_spec(ctx, name, ctx.head, argv, secrets=token)


WILDCARDS = ("0.0.0.0", "::")


def _frontend_specs(ctx: PlanContext) -> list[InstanceSpec]:
    """``frontend.processes`` frontends on each of the first ``frontend.hosts`` hosts,
    numbered host by host. On the head they listen on ``frontend.host``, by default the
    head's address (loopback on a local target); elsewhere on their host's address (or the
    wildcard). ``address`` is where the supervisor reaches each. Several frontends share
    their routers' bookings; those of one host share the port."""
    recipe = ctx.recipe
    front = recipe.frontend
    # Cores are known only of this machine; other targets' hosts get one process each.
    processes = front.process_count(os.cpu_count() if recipe.target.one_machine else None)
    total = processes * front.hosts
    # The keys' variable is read where `up` runs and delivered like any secret: a remote
    # frontend's shell does not have it.
    keys = front.api_keys_env
    secrets = {keys: SecretRef(env=keys)} if keys else {}
    specs = []
    for index in range(total):
        host = ctx.hosts[index // processes]
        listen = front.host if front.host in WILDCARDS or index < processes else None
        listen = listen or host.address
        name = InstanceName("frontend", index)
        argv = frontend_argv(
            recipe, str(name), listen, ctx.discovery_url,
            share=total > 1, reuse=processes > 1, frontends=total,
        )  # fmt: skip
        address = host.address if listen in WILDCARDS else listen
        ports = {"http": front.port}
        specs.append(
            _component_spec(ctx, name, host, argv, address=address, ports=ports, secrets=secrets)
        )
    return specs


def client_endpoint(recipe: Recipe) -> str:
    """The OpenAI base URL a client on this machine uses (what ``up`` prints), without
    placing anything. A Slurm target's head is known only inside its allocation."""
    if recipe.target.allocated:
        raise PlanError(
            "the frontend's host of a slurm target is known only inside its allocation "
            "(`dynamoctl status` shows it once the job runs)"
        )
    hosts, _ = target_hosts(recipe)
    return _endpoint(recipe, hosts[0])


def _endpoint(recipe: Recipe, head: Host) -> str:
    """The OpenAI base URL people use: the head's name unless the recipe binds one address."""
    host = recipe.frontend.host
    if host is None or host in WILDCARDS:
        host = head.address if recipe.target.one_machine else head.name
    return f"http://{host}:{recipe.frontend.port}/v1"


def build_plan(
    recipe: Recipe,
    run_dir: Path,
    allocation: list[str] | None = None,
    resolve: Mapping[str, str] = {},
) -> tuple[Plan, GpuMap]:
    """The plan and the GPU map left after placing it (``scale`` places more later)."""
    hosts, gpus_per_host = target_hosts(recipe, allocation, resolve)
    ctx = PlanContext.build(recipe, hosts, run_dir)
    instances: list[InstanceSpec] = []
    disc = recipe.discovery
    if isinstance(disc, EtcdDiscovery) and disc.managed:
        instances.append(_etcd_spec(ctx))
    gpu_map = GpuMap(hosts, gpus_per_host)
    for role in PLACEMENT_ORDER:
        pool = recipe.workers.pools().get(role)
        if pool is None:
            continue
        for index in range(pool.replicas):
            instances += _place(ctx, role, index, gpu_map)
    instances += [_router_spec(ctx, index) for index in range(recipe.frontend.router.replicas)]
    instances += _frontend_specs(ctx)
    if recipe.planner is not None:
        instances.append(_planner_spec(ctx))
    plan = Plan(
        name=recipe.name,
        namespace=recipe.namespace,
        target=recipe.target.kind,
        hosts=hosts,
        discovery_url=ctx.discovery_url,
        endpoint=_endpoint(recipe, ctx.head),
        model=recipe.model.name,
        instances=instances,
    )
    return plan, gpu_map


def place_replica(
    recipe: Recipe, role: Role, index: int, gpu_map: GpuMap, url: str, run_dir: Path
) -> list[InstanceSpec]:
    """Replica ``index`` of pool ``role`` placed on what ``gpu_map`` has left (what
    ``scale`` adds): one instance, or a gang's members, leader first."""
    ctx = PlanContext(recipe, gpu_map.hosts, url, run_dir, recipe.target.interpreter())
    return _place(ctx, role, index, gpu_map)


def _place(ctx: PlanContext, role: Role, index: int, gpu_map: GpuMap) -> list[InstanceSpec]:
    pool = ctx.pool(role)
    if pool.nodes_per_replica > 1:
        return _place_gang(ctx, role, index, gpu_map)
    placed = gpu_map.take(pool.gpus_per_replica)
    if placed is None:
        raise PlanError(
            f"workers.{role}.gpus_per_replica: replica {index} needs "
            f"{pool.gpus_per_replica} GPU(s) but the target has {len(gpu_map.hosts)} host(s) "
            f"with {gpu_map.gpus_per_host} GPU(s) each, already taken by earlier replicas"
        )
    return [worker_spec(ctx, role, index, placed[0], placed[1])]


def _place_gang(ctx: PlanContext, role: Role, index: int, gpu_map: GpuMap) -> list[InstanceSpec]:
    """Replica ``index`` of a multi-node pool: whole hosts, one member each."""
    pool = ctx.pool(role)
    members = gpu_map.take_nodes(pool.nodes_per_replica, shared=ctx.recipe.target.one_machine)
    if members is None:
        free = len(gpu_map.hosts) - len(gpu_map.whole)
        raise PlanError(
            f"workers.{role}.nodes_per_replica: replica {index} needs "
            f"{pool.nodes_per_replica} whole node(s) but only {free} of the target's "
            f"{len(gpu_map.hosts)} are left by earlier replicas"
        )
    return gang_specs(ctx, role, index, members)


def render(plan: Plan, describe: Callable[[InstanceSpec], list[str]]) -> str:
    """The dry run's text: every instance, its host, GPUs, environment and command."""
    hosts = ", ".join(f"{h.name} ({h.address})" for h in plan.hosts if not h.symbolic)
    lines = [
        f"deployment {plan.name} (namespace {plan.namespace}), target {plan.target}, "
        f"hosts {hosts or ', '.join(h.name for h in plan.hosts)}",
    ]
    if any(h.symbolic for h in plan.hosts):
        lines.append(
            "  (symbolic: the Slurm allocation's nodes; <nodeN> stands for node N's address, "
            "resolved inside the allocation; `--nodes` names them for a dry run)"
        )
    lines += [
        f"discovery {plan.discovery_url}",
        f"endpoint  {plan.endpoint} (model {plan.model})",
        "",
    ]
    for spec in plan.instances:
        gpus = ",".join(map(str, spec.gpus)) or "-"
        gang = f", gang {spec.gang} rank {spec.rank}/{spec.nnodes}" if spec.gang else ""
        if spec.mpi_nodes:
            world = f"{spec.mpi_tasks_per_node} x {len(spec.mpi_nodes)} ranks"
            gang = f", gang {spec.gang}: one MPI world of {world} on {','.join(spec.mpi_nodes)}"
        lines.append(f"[{spec.name}] {spec.component} on {spec.host}, gpus {gpus}{gang}")
        if spec.env:
            lines.append("  env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items()))
        if spec.secrets:  # where each is read, never its value
            masked = (f"{k}={ref.describe()}" for k, ref in spec.secrets.items())
            lines.append("  secrets " + " ".join(masked))
        lines.append("  $ " + shlex.join(describe(spec)))
    return "\n".join(lines) + "\n"
