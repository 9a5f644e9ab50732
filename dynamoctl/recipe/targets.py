"""Where a deployment runs: this machine, SSH-reachable hosts, or a Slurm allocation
(the recipe's ``target``, one model per kind)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from dynamoctl.recipe.fields import (
    LocalPath,
    NonEmptyStr,
    Port,
    RecipeModel,
    check_ipv4,
    check_time_limit,
    check_unique,
    rule_error,
)


class TargetModel(RecipeModel):
    """What the plan asks every target kind (each answers for itself, no ``isinstance``)."""

    one_machine: ClassVar[bool] = False
    """Every host is this machine (gangs share it; the endpoint is its loopback address)."""
    allocated: ClassVar[bool] = False
    """Its hosts are known only inside an allocation (Slurm), not where ``up`` runs."""

    def interpreter(self) -> str:
        """The Python that runs dynamoctl on the hosts: this one (same machine, or nodes
        sharing this environment on shared storage)."""
        return sys.executable

    def etcd_data_dir(self, run_dir: Path, name: str) -> str:
        """Where a managed etcd keeps its data: the run directory (on storage the nodes
        share, under Slurm)."""
        return str(run_dir / "etcd")


class LocalTarget(TargetModel):
    """Every component on the machine that runs ``dynamoctl up``."""

    one_machine: ClassVar[bool] = True

    kind: Literal["local"]
    """``local``: child processes of the supervisor, each in its own process group."""
    gpus: int | None = Field(default=None, ge=0, le=64)
    """GPUs on this machine that replicas may use. Default: counted with ``nvidia-smi -L``
    (0 without it). At most 64, several times the GPUs of the largest machines."""


class SshTarget(TargetModel):
    """Nodes reachable over SSH; remote processes outlive the SSH session."""

    kind: Literal["ssh"]
    """``ssh``: components are started on ``hosts`` over SSH."""
    hosts: Annotated[list[NonEmptyStr], AfterValidator(check_unique)] = Field(min_length=1)
    """Host names or addresses, as ``ssh`` accepts them; the first one is the head node."""
    user: str | None = None
    """Remote user. Default: whatever ``ssh`` picks (``~/.ssh/config``, then the local user)."""
    port: Port = 22
    """SSH port."""
    key: LocalPath | None = None
    """Private key file. Default: the SSH agent and ``~/.ssh/config``."""
    known_hosts: LocalPath | None = None
    """File of trusted host keys; an unknown host key is refused. Default:
    ``~/.ssh/known_hosts``."""
    python: NonEmptyStr = "python3"
    """Python interpreter on the hosts that has dynamoctl installed, e.g. a venv's
    ``bin/python``."""
    workdir: str | None = None
    """Remote working directory of components (a managed etcd keeps its data there).
    Default: the remote home."""
    gpus_per_host: int = Field(default=0, ge=0, le=64)
    """GPUs on each host that replicas may use; a replica fits on one host unless its pool
    spans several (``nodes_per_replica``). At most 64, several times the GPUs of the
    largest machines."""
    addresses: dict[str, Annotated[str, AfterValidator(check_ipv4)]] = Field(default_factory=dict)
    """IPv4 address each host's components bind and advertise, by host name, where the
    name does not resolve to it on the supervisor's machine (an ``~/.ssh/config`` alias) or
    the host has several networks. Default: the name, resolved on the supervisor's machine."""

    @model_validator(mode="after")
    def _addresses_name_hosts(self) -> SshTarget:
        for name in self.addresses:
            if name not in self.hosts:
                raise rule_error(f"addresses.{name}", "is not one of target.hosts")
        return self

    def interpreter(self) -> str:
        return self.python

    def etcd_data_dir(self, run_dir: Path, name: str) -> str:
        """The remote working directory (the run directory is on this machine)."""
        return f"{self.workdir or '.'}/dynamoctl-{name}-etcd"


class SlurmContainer(RecipeModel):
    """A container for every job step (pyxis/enroot ``srun --container-*``)."""

    image: NonEmptyStr
    """Image reference or squashfs file, passed to ``--container-image``."""
    mounts: list[NonEmptyStr] = Field(default_factory=list)
    """``SRC:DST[:FLAGS]`` entries, passed to ``--container-mounts``."""


class SlurmGrowth(RecipeModel):
    """Extra Slurm jobs ``scale`` (or the planner) may submit when the allocation has no
    room for another replica: their nodes join the deployment, and each job is released
    (its replicas drained first) once none of its nodes runs a replica
    (docs/operations.md, "Growing beyond the allocation"). Off unless ``max_jobs`` > 0."""

    max_jobs: int = Field(default=0, ge=0, le=64)
    """Extra jobs at once, at most; 0: never grow (a scale past the allocation is refused).
    With ``nodes_per_job``, the bound on nodes the deployment adds to its allocation."""
    nodes_per_job: int = Field(default=1, ge=1, le=1024)
    """Nodes each extra job asks for, shaped as the allocation (partition, account, GPUs
    per node, time limit, container, extra_sbatch_args)."""
    start_timeout: float = Field(default=600.0, gt=0, le=86400)
    """Seconds an extra job may wait in the queue; then it is cancelled and the replicas
    it was for are not started (status says so)."""


class SlurmTarget(TargetModel):
    """A Slurm allocation; each component is one ``srun`` job step."""

    allocated: ClassVar[bool] = True

    kind: Literal["slurm"]
    """``slurm``: run inside an allocation, or submit one with sbatch from a login node."""
    partition: NonEmptyStr
    """Partition to submit to (``--partition``)."""
    account: str | None = None
    """Account to charge (``--account``). Default: the user's default account."""
    nodes: int = Field(default=1, ge=1, le=1024)
    """Nodes in the allocation (``--nodes``). At most 1024: one frontend and one etcd serve
    the whole deployment; past that, run several."""
    gpus_per_node: int = Field(ge=0, le=64)
    """GPUs on each node (``--gpus-per-node``); a worker replica fits on one node unless
    its pool spans several (``nodes_per_replica``). At most 64, several times the GPUs of
    the largest machines."""
    time_limit: Annotated[str, AfterValidator(check_time_limit)] | None = None
    """Wall-clock limit, ``HH:MM:SS`` or ``D-HH:MM:SS`` (``--time``). Default: the partition's."""
    container: SlurmContainer | None = None
    """Run every component in this container. Default: on the nodes' own environment."""
    extra_sbatch_args: list[NonEmptyStr] = Field(default_factory=list)
    """Extra ``sbatch`` arguments, verbatim, e.g. ``["--exclusive", "--qos=high"]``."""
    mpi: str = Field(default="pmix", pattern=r"^[A-Za-z0-9_]+$")
    """Slurm's MPI plugin (``srun --mpi``) for a TensorRT-LLM replica over several nodes,
    which runs as one MPI world: ``pmix`` (as Dynamo's and srt-slurm's launches), or what
    ``srun --mpi=list`` shows at the site (``pmix_v4``, ``pmi2``...). ``up`` checks that a
    step with it starts before starting anything. Unused by other engines."""
    addresses: dict[str, Annotated[str, AfterValidator(check_ipv4)]] = Field(default_factory=dict)
    """IPv4 address each node's components bind and advertise, by node name, where the name
    does not resolve to the network the nodes should talk over (several networks per node).
    Default: the node name, resolved inside the allocation."""
    growth: SlurmGrowth = Field(default_factory=SlurmGrowth)
    """Growing beyond the allocation with extra jobs when a scale needs more GPUs than it
    has. Default: off."""

    def interpreter(self) -> str:
        if self.container is not None:
            return "python3"  # the image's interpreter, which has dynamoctl installed
        return super().interpreter()


Target = Annotated[LocalTarget | SshTarget | SlurmTarget, Field(discriminator="kind")]
