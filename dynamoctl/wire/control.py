"""The supervisor's control endpoint: what ``dynamoctl status`` and friends exchange."""

from __future__ import annotations

import msgspec

from dynamoctl.wire.planner import PlannerStatus
from dynamoctl.wire.start_phases import StartPhases
from dynamoctl.wire.states import GrowthState, Phase, State


class InstanceStatus(msgspec.Struct, kw_only=True):
    """One row of ``dynamoctl status``."""

    name: str
    pool: str
    component: str
    host: str
    pid: int | None
    """Process-group leader on ``host`` (the keeper; under Slurm the local ``srun``)."""
    state: State
    """Its state; on the wire, the member's value (``READY``)."""
    restarts: int
    uptime_s: float | None
    """Seconds since the current process started; None when none runs."""
    inflight: int | None = None
    """Requests open on the instance (workers), when known; None when no process runs."""
    kv_usage: float | None = None
    """Fraction of the KV cache in use (workers), when known; None when no process runs."""
    last_exit: int | None = None
    """Exit status of the previous process, when one ended."""
    message: str = ""
    """The last failure, in words (kept after a successful restart)."""
    gang: str = ""
    """The multi-node replica it belongs to (its leader's name); empty for one node."""
    rank: int = 0
    """Its node rank in ``gang`` (0: the leader, which serves)."""
    mpi_nodes: list[str] = []
    """The nodes its one launch spans (a TensorRT-LLM gang's MPI world); empty otherwise."""
    start: StartPhases | None = None
    """How long its last start took, by phase; None before its first start."""
    adapters: list[str] = []
    """A worker's LoRA adapters, from its ``/health`` (``dynamoctl lora``)."""


class DiscoveryStatus(msgspec.Struct, kw_only=True):
    """Whether the supervisor reaches discovery. While it does not, instances are judged
    by their last known records and keep serving (docs/discovery.md, "Outages")."""

    reachable: bool = True
    location: str = ""
    """Where discovery is (the etcd endpoint or the embedded file)."""
    unreachable_s: float | None = None
    """Seconds it has been unreachable; None while reachable."""
    error: str = ""
    """The last failure, in words."""


class GrowthJob(msgspec.Struct, kw_only=True):
    """An extra Slurm job the deployment grew by (recipe ``target.growth``)."""

    job: str
    """Its Slurm job id."""
    state: GrowthState
    nodes: list[str] = []
    """Its nodes, once it runs."""
    replicas: list[str] = []
    """The replicas placed (or to be placed) on its nodes."""
    message: str = ""
    """Why it failed, in words."""


class StatusReport(msgspec.Struct, kw_only=True):
    name: str
    phase: Phase
    """The deployment's phase; on the wire, the member's value (``serving``)."""
    endpoint: str
    model: str
    target: str
    instances: list[InstanceStatus]
    discovery: DiscoveryStatus = msgspec.field(default_factory=DiscoveryStatus)
    """Whether the supervisor reaches discovery (absent from older supervisors)."""
    planner: PlannerStatus | None = None
    """The SLA planner's mode and last decision, as its last probe saw it; None without a
    planner (or before its first probe)."""
    growth: list[GrowthJob] = []
    """Extra Slurm jobs beyond the allocation, current and past (``target.growth``)."""
    measured_start_s: dict[str, float] = {}
    """Each worker pool's measured start-up, seconds from launch to ready: the median of the
    recent starts of the model on the pool's kind of node (kept in the state directory
    across deployments); a pool none of whose starts is known yet is absent."""


class DrainRequest(msgspec.Struct, kw_only=True):
    target: str
    """An instance name (``agg-1``) or a pool name (``agg``)."""


class ScaleRequest(msgspec.Struct, kw_only=True):
    pool: str
    replicas: int
    by_planner: bool = False
    """Sent by the planner, the one caller that sizes the pools of a recipe with a
    ``planner:`` section without ``force``."""
    force: bool = False
    """Scale a pool the planner sizes anyway (``dynamoctl scale --force``): it may change
    it again at its next decision. Without it such a request is refused (409)."""


class ScaleReply(msgspec.Struct, kw_only=True):
    started: list[str] = []
    """Replicas added (each starts, then becomes READY)."""
    drained: list[str] = []
    """Replicas taken away (each drains, then is STOPPED)."""
    withdrawn: list[str] = []
    """Replicas given up before they started: their extra Slurm job was still queued."""
    submitted: list[str] = []
    """Extra Slurm jobs submitted for some of ``started`` (the allocation was full): those
    replicas appear in ``status`` once their job runs."""
    note: str = ""
    """For the operator: a forced scale of a pool the planner sizes says it may not last."""


class DownRequest(msgspec.Struct, kw_only=True):
    now: bool = False
    """Skip draining: SIGTERM, a short deadline, then SIGKILL."""


class ControlReply(msgspec.Struct, kw_only=True):
    ok: bool
    message: str = ""
    instances: list[str] = []
    """Instances the command acted on."""
