"""What every part of the plan reads, built once per plan: the recipe, the hosts with their
addresses, the discovery URL, the run directory and the Python the hosts run dynamoctl
with (:class:`PlanContext`); and the hosts of each target kind (:func:`target_hosts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamoctl.discovery.registry import etcd_url
from dynamoctl.launch.api import SecretRef
from dynamoctl.launch.gpus import count_local_gpus
from dynamoctl.launch.slurm.jobs import sbatch_resources
from dynamoctl.plan.hosts import LOCALHOST, Host, HostError, resolve_host, symbolic_host
from dynamoctl.recipe.discovery import EmbeddedDiscovery, EtcdDiscovery
from dynamoctl.recipe.models import Recipe, Role
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget
from dynamoctl.recipe.workers import WorkerPool
from dynamoctl.supervisor import credentials

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380

BASE_ENV = {"PYTHONUNBUFFERED": "1"}
"""The environment every process of the plan gets (logs reach the keeper line by line)."""


class PlanError(ValueError):
    """The recipe cannot be placed on these hosts; the message names the field."""


@dataclass(frozen=True)
class PlanContext:
    """One plan's inputs, as every instance of it reads them."""

    recipe: Recipe
    hosts: list[Host]
    """The target's hosts with their addresses; the first is the head."""
    discovery_url: str
    run_dir: Path
    python: str
    """The interpreter that runs dynamoctl on the hosts."""

    @classmethod
    def build(cls, recipe: Recipe, hosts: list[Host], run_dir: Path) -> PlanContext:
        url = discovery_url(recipe, run_dir, hosts[0])
        return cls(recipe, hosts, url, run_dir, recipe.target.interpreter())

    @property
    def head(self) -> Host:
        """Where the managed etcd, the frontend and the planner run."""
        return self.hosts[0]

    def pool(self, role: Role) -> WorkerPool:
        return self.recipe.workers.pools()[role]

    def component_env(self) -> tuple[dict[str, str], dict[str, SecretRef]]:
        """Environment and secrets every worker, router and frontend gets."""
        env = {**BASE_ENV, **credentials.component_env(self.recipe)}
        return env, credentials.component_secrets(self.recipe, self.run_dir)


def discovery_url(recipe: Recipe, run_dir: Path, head: Host) -> str:
    disc = recipe.discovery
    if isinstance(disc, EmbeddedDiscovery):
        return f"embedded://{disc.path or run_dir / 'discovery'}"
    assert isinstance(disc, EtcdDiscovery)
    if disc.managed:
        scheme = "etcd+https" if credentials.managed_etcd_tls(recipe) else "etcd"
        return f"{scheme}://{head.address}:{ETCD_CLIENT_PORT}"
    return etcd_url(disc.endpoints)


# -- hosts and GPUs, per target kind ---------------------------------------------------------

Resolve = Mapping[str, str]


def _local_hosts(
    target: LocalTarget, allocation: list[str] | None, resolve: Resolve
) -> tuple[list[Host], int]:
    gpus = target.gpus if target.gpus is not None else count_local_gpus()
    return [Host("localhost", LOCALHOST)], gpus


def _ssh_hosts(
    target: SshTarget, allocation: list[str] | None, resolve: Resolve
) -> tuple[list[Host], int]:
    known = {**target.addresses, **resolve}
    spans = len(target.hosts) > 1
    hosts = [resolve_host(name, known, field="target.hosts", spans=spans) for name in target.hosts]
    return hosts, target.gpus_per_host


def _slurm_hosts(
    target: SlurmTarget, allocation: list[str] | None, resolve: Resolve
) -> tuple[list[Host], int]:
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


HOSTS: dict[str, Callable[[Any, list[str] | None, Resolve], tuple[list[Host], int]]] = {
    "local": _local_hosts,
    "ssh": _ssh_hosts,
    "slurm": _slurm_hosts,
}
"""The hosts of each target kind (as :mod:`dynamoctl.launch.registry` has its launcher)."""


def target_hosts(
    recipe: Recipe, allocation: list[str] | None = None, resolve: Mapping[str, str] = {}
) -> tuple[list[Host], int]:
    """Hosts with their addresses, and GPUs per host. Slurm hosts are the allocation's
    nodes when known, else symbolic ``node0..`` (a dry run on a login node); ``resolve``
    gives addresses that override name resolution (a dry run's ``--resolve``)."""
    try:
        return HOSTS[recipe.target.kind](recipe.target, allocation, resolve)
    except HostError as exc:
        raise PlanError(str(exc)) from None
