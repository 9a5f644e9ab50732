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

import msgspec

from dynamoctl.discovery.registry import etcd_url
from dynamoctl.launch.api import InstanceSpec, SecretRef
from dynamoctl.launch.gpus import count_local_gpus
from dynamoctl.launch.slurm_jobs import sbatch_resources
from dynamoctl.recipe.models import (
    EmbeddedDiscovery,
    EtcdDiscovery,
    Recipe,
    Role,
)
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.commands import frontend_argv, planner_argv, router_argv
from dynamoctl.supervisor.gang_plan import gang_specs
from dynamoctl.supervisor.gpu_map import GpuMap as GpuMap  # re-exported: the plan's result
from dynamoctl.supervisor.hosts import LOCALHOST, Host, HostError, resolve_host, symbolic_host
from dynamoctl.supervisor.instance import InstanceName
from dynamoctl.supervisor.worker_plan import BASE_ENV, component_env, python_for, worker_spec
from dynamoctl.supervisor.worker_plan import PlanError as PlanError  # re-exported: its error

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    namespace: str
    target: str
    hosts: list[Host]
    discovery_url: str
    endpoint: str
    """The OpenAI base URL clients use."""
    model: str
    instances: list[InstanceSpec]

    def by_pool(self, pool: str) -> list[InstanceSpec]:
        return [spec for spec in self.instances if spec.pool == pool]


# -- hosts and GPUs ---------------------------------------------------------------------------


def target_hosts(
    recipe: Recipe, allocation: list[str] | None = None, resolve: Mapping[str, str] = {}
) -> tuple[list[Host], int]:
    """Hosts with their addresses, and GPUs per host. Slurm hosts are the allocation's
    nodes when known, else symbolic ``node0..`` (a dry run on a login node); ``resolve``
    gives addresses that override name resolution (a dry run's ``--resolve``)."""
    target = recipe.target
    if isinstance(target, LocalTarget):
        gpus = target.gpus if target.gpus is not None else count_local_gpus()
        return [Host("localhost", LOCALHOST)], gpus
    try:
        if isinstance(target, SshTarget):
            known = {**target.addresses, **resolve}
            spans = len(target.hosts) > 1
            hosts = [
                resolve_host(name, known, field="target.hosts", spans=spans)
                for name in target.hosts
            ]
            return hosts, target.gpus_per_host
        assert isinstance(target, SlurmTarget)
        if allocation is None:
            return [symbolic_host(f"node{i}") for i in range(target.nodes)], target.gpus_per_node
        if len(allocation) < target.nodes:
            raise PlanError(
                f"target.nodes: the recipe needs {target.nodes} node(s) but this Slurm "
                f"allocation has {len(allocation)} ({', '.join(allocation)}); submit with "
                f"`sbatch {' '.join(sbatch_resources(target))} slurm/launch.sh RECIPE`, or run "
                "`dynamoctl up RECIPE` on the login node, which submits with those options"
            )
        spans = target.nodes > 1
        known = {**target.addresses, **resolve}
        hosts = [
            resolve_host(name, known, field="the Slurm allocation's node", spans=spans)
            for name in allocation
        ]
        return hosts, target.gpus_per_node
    except HostError as exc:
        raise PlanError(str(exc)) from None


# -- the plan ---------------------------------------------------------------------------------


def discovery_url(recipe: Recipe, run_dir: Path, head: Host) -> str:
    disc = recipe.discovery
    if isinstance(disc, EmbeddedDiscovery):
        return f"embedded://{disc.path or run_dir / 'discovery'}"
    assert isinstance(disc, EtcdDiscovery)
    if disc.managed:
        scheme = "etcd+https" if credentials.managed_etcd_tls(recipe) else "etcd"
        return f"{scheme}://{head.address}:{ETCD_CLIENT_PORT}"
    return etcd_url(disc.endpoints)


def _etcd_spec(recipe: Recipe, head: Host, data_dir: str, run_dir: Path) -> InstanceSpec:
    """etcd listens on the head's address (it refuses names there) and advertises its
    name; the peer URLs stay addresses, since etcd matches them against each other.
    With TLS it starts through the wrapper that writes its certificate next to its data
    (:mod:`dynamoctl.discovery.etcd_server`), from secrets."""
    tls = credentials.managed_etcd_tls(recipe)
    scheme = "https" if tls else "http"
    listen = f"{scheme}://{head.address}:{ETCD_CLIENT_PORT}"
    peer = f"{scheme}://{head.address}:{ETCD_PEER_PORT}"
    member = f"dynamoctl-{recipe.name}"
    wrapper = [python_for(recipe), "-m", "dynamoctl.discovery.etcd_server", f"{data_dir}-tls"]
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
        secrets=credentials.etcd_secrets(run_dir) if tls else {},
    )


def _component_spec(
    recipe: Recipe,
    name: InstanceName,
    host: Host,
    argv: list[str],
    run_dir: Path,
    *,
    address: str = "",
    ports: Mapping[str, int] = {},
    secrets: Mapping[str, SecretRef] = {},
) -> InstanceSpec:
    """A router, frontend or planner instance: ``python -m dynamoctl ARGV`` on ``host``
    (bound to ``address``, by default the host's), with the components' common environment
    and secrets plus ``secrets``."""
    env, common = component_env(recipe, run_dir)
    return InstanceSpec(
        name=str(name),
        pool=name.pool,
        component=name.pool,
        host=host.name,
        address=address or host.address,
        ports=dict(ports),
        argv=[python_for(recipe), "-m", "dynamoctl", *argv],
        env=env,
        secrets={**common, **secrets},
    )


def _router_spec(recipe: Recipe, index: int, host: Host, url: str, run_dir: Path) -> InstanceSpec:
    """A standalone router replica (``frontend.router.replicas > 0``)."""
    name = InstanceName("router", index)
    argv = router_argv(recipe, str(name), host.address, url)
    return _component_spec(recipe, name, host, argv, run_dir)


def _planner_spec(recipe: Recipe, head: Host, url: str, run_dir: Path) -> InstanceSpec:
    """The SLA planner (a ``planner:`` section), on the head host beside the frontend; it
    alone gets the control endpoint's token (its ``scale`` requests)."""
    name = InstanceName("planner", 0)
    argv = planner_argv(recipe, str(name), head.address, url)
    token = credentials.planner_secrets(run_dir)
    return _component_spec(recipe, name, head, argv, run_dir, secrets=token)


WILDCARDS = ("0.0.0.0", "::")


def _frontend_specs(
    recipe: Recipe, hosts: list[Host], url: str, run_dir: Path
) -> list[InstanceSpec]:
    """``frontend.processes`` frontends on each of the first ``frontend.hosts`` hosts,
    numbered host by host. On the head they listen on ``frontend.host``, by default the
    head's address (loopback on a local target); elsewhere on their host's address (or the
    wildcard). ``address`` is where the supervisor reaches each. Several frontends share
    their routers' bookings; those of one host share the port."""
    front = recipe.frontend
    local = isinstance(recipe.target, LocalTarget)
    processes = front.process_count(os.cpu_count() if local else None)
    total = processes * front.hosts
    # The keys' variable is read where `up` runs and delivered like any secret: a remote
    # frontend's shell does not have it.
    keys = front.api_keys_env
    secrets = {keys: SecretRef(env=keys)} if keys else {}
    specs = []
    for index in range(total):
        host = hosts[index // processes]
        listen = front.host if front.host in WILDCARDS or index < processes else None
        listen = listen or host.address
        name = InstanceName("frontend", index)
        argv = frontend_argv(recipe, str(name), listen, url, share=total > 1, reuse=processes > 1)
        address = host.address if listen in WILDCARDS else listen
        specs.append(
            _component_spec(
                recipe,
                name,
                host,
                argv,
                run_dir,
                address=address,
                ports={"http": front.port},
                secrets=secrets,
            )
        )
    return specs


def client_endpoint(recipe: Recipe) -> str:
    """The OpenAI base URL a client on this machine uses (what ``up`` prints), without
    placing anything. A Slurm target's head is known only inside its allocation."""
    if isinstance(recipe.target, SlurmTarget):
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
        host = head.address if isinstance(recipe.target, LocalTarget) else head.name
    return f"http://{host}:{recipe.frontend.port}/v1"


def build_plan(
    recipe: Recipe,
    run_dir: Path,
    allocation: list[str] | None = None,
    resolve: Mapping[str, str] = {},
) -> tuple[Plan, GpuMap]:
    """The plan and the GPU map left after placing it (``scale`` places more later)."""
    hosts, gpus_per_host = target_hosts(recipe, allocation, resolve)
    head = hosts[0]
    url = discovery_url(recipe, run_dir, head)
    instances: list[InstanceSpec] = []
    disc = recipe.discovery
    if isinstance(disc, EtcdDiscovery) and disc.managed:
        # Local and Slurm: the run directory (on storage the nodes share, under Slurm);
        # SSH: the remote working directory.
        data_dir = str(run_dir / "etcd")
        if isinstance(recipe.target, SshTarget):
            data_dir = f"{recipe.target.workdir or '.'}/dynamoctl-{recipe.name}-etcd"
        instances.append(_etcd_spec(recipe, head, data_dir, run_dir))
    gpu_map = GpuMap(hosts, gpus_per_host)
    roles: tuple[Role, ...] = ("prefill", "decode", "agg")
    for role in roles:
        pool = recipe.workers.pools().get(role)
        if pool is None:
            continue
        for index in range(pool.replicas):
            instances += place_replica(recipe, role, index, gpu_map, url, run_dir)
    for index in range(recipe.frontend.router.replicas):  # spread, like CPU replicas
        instances.append(_router_spec(recipe, index, hosts[index % len(hosts)], url, run_dir))
    instances += _frontend_specs(recipe, hosts, url, run_dir)
    if recipe.planner is not None:
        instances.append(_planner_spec(recipe, head, url, run_dir))
    plan = Plan(
        name=recipe.name,
        namespace=recipe.namespace,
        target=recipe.target.kind,
        hosts=hosts,
        discovery_url=url,
        endpoint=_endpoint(recipe, head),
        model=recipe.model.name,
        instances=instances,
    )
    return plan, gpu_map


def place_replica(
    recipe: Recipe, role: Role, index: int, gpu_map: GpuMap, url: str, run_dir: Path
) -> list[InstanceSpec]:
    """Replica ``index`` of pool ``role`` placed on what ``gpu_map`` has left (also what
    ``scale`` adds): one instance, or a gang's members, leader first."""
    pool = recipe.workers.pools()[role]
    if pool.nodes_per_replica > 1:
        return _place_gang(recipe, role, index, gpu_map, url, run_dir)
    placed = gpu_map.take(pool.gpus_per_replica)
    if placed is None:
        raise PlanError(
            f"workers.{role}.gpus_per_replica: replica {index} needs "
            f"{pool.gpus_per_replica} GPU(s) but the target has {len(gpu_map.hosts)} host(s) "
            f"with {gpu_map.gpus_per_host} GPU(s) each, already taken by earlier replicas"
        )
    return [worker_spec(recipe, role, index, placed[0], placed[1], url, run_dir)]


def _place_gang(
    recipe: Recipe, role: Role, index: int, gpu_map: GpuMap, url: str, run_dir: Path
) -> list[InstanceSpec]:
    """Replica ``index`` of a multi-node pool: whole hosts, one member each."""
    pool = recipe.workers.pools()[role]
    members = gpu_map.take_nodes(
        pool.nodes_per_replica, shared=isinstance(recipe.target, LocalTarget)
    )
    if members is None:
        free = len(gpu_map.hosts) - len(gpu_map.whole)
        raise PlanError(
            f"workers.{role}.nodes_per_replica: replica {index} needs "
            f"{pool.nodes_per_replica} whole node(s) but only {free} of the target's "
            f"{len(gpu_map.hosts)} are left by earlier replicas"
        )
    return gang_specs(recipe, role, index, members, url, run_dir)


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
