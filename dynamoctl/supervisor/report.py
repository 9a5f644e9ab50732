"""What the supervisor tells others: the ``status`` report, ``state.json``, why ``up``
rolled back, and its control endpoint's record in discovery."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.launch.api import ProcessRecord
from dynamoctl.plan.placed import Plan
from dynamoctl.supervisor.instance import Instance
from dynamoctl.supervisor.rundir import RunState
from dynamoctl.wire.control import DiscoveryStatus, InstanceStatus, StatusReport
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.planner import PlannerStatus
from dynamoctl.wire.records import Component, Endpoint
from dynamoctl.wire.states import Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlAccess:
    """Where the supervisor's control endpoint listens and what opens it: given at
    construction (``serve`` binds the endpoint first), recorded in ``state.json``."""

    url: str = ""
    """Base URL of the control endpoint, as commands on other hosts reach it."""
    token: str = ""
    """Bearer token every route but ``/metrics`` requires."""
    slurm_job: str = ""
    """The Slurm job the supervisor runs in, under a slurm target."""


def instance_status(inst: Instance, now: float) -> InstanceStatus:
    """One row of ``status``: figures only while a process runs (none are stale)."""
    proc, running = inst.proc, inst.running
    sample = inst.sample if running and isinstance(inst.sample, WorkerHealth) else None
    return InstanceStatus(
        name=inst.spec.name,
        pool=inst.spec.pool,
        component=inst.spec.component,
        host=inst.spec.host,
        pid=proc.record.pid if proc is not None and running else None,
        state=inst.state,
        restarts=inst.restarts,
        uptime_s=now - inst.started_at if running and inst.started_at else None,
        inflight=sample.inflight if sample else None,
        kv_usage=sample.kv_usage if sample else None,
        last_exit=inst.last_exit,
        message=inst.message,
        gang=inst.spec.gang,
        rank=inst.spec.rank,
        mpi_nodes=inst.spec.mpi_nodes,
        start=inst.clock.last,
        adapters=sample.adapters if sample else [],
    )


def status_report(
    plan: Plan,
    phase: Phase,
    instances: Iterable[Instance],
    discovery: DiscoveryStatus | None = None,
) -> StatusReport:
    now, instances = time.monotonic(), list(instances)
    planner = next(
        (i.sample for i in instances if i.running and isinstance(i.sample, PlannerStatus)), None
    )
    return StatusReport(
        name=plan.name,
        phase=phase,
        endpoint=plan.endpoint,
        model=plan.model,
        target=plan.target,
        instances=[instance_status(inst, now) for inst in instances],
        discovery=discovery or DiscoveryStatus(),
        planner=planner,
    )


LAST_LINE_BYTES = 4096
"""How much of a log's end is read for its last line."""


def last_log_line(log_file: Path) -> str:
    """The last non-empty line of ``log_file`` (what a process that exited said last, its
    error as often as not), cut to 300 characters; empty when there is none."""
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - LAST_LINE_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def startup_failure(inst: Instance, log_file: Path, lines: int = 15) -> str:
    """Why ``up`` rolls back: the instance, its last failure, and its log's last lines."""
    try:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        tail = "(no log)"
    spec = inst.spec
    return (
        f"{spec.name} ({spec.component} on {spec.host}) failed to start: "
        f"{inst.message or 'exited'}\n--- last lines of {log_file} ---\n{tail}"
    )


def run_state(
    plan: Plan,
    recipe_path: str,
    phase: Phase,
    instances: Iterable[Instance],
    *,
    control: str,
    token: str,
    slurm_job: str,
    error: str,
) -> RunState:
    """``state.json``: the plan as it stands (scaled replicas included) and the record of
    every running process."""
    instances = list(instances)
    records: dict[str, ProcessRecord] = {
        inst.spec.name: inst.proc.record
        for inst in instances
        if inst.proc is not None and inst.running
    }
    # Taken back but not watched yet: recorded all the same, so that a supervisor killed
    # again in that moment leaves them adoptable rather than orphaned.
    records |= {
        inst.spec.name: inst.adopted.record
        for inst in instances
        if inst.adopted is not None and inst.adopted.returncode is None
    }
    return RunState(
        name=plan.name,
        recipe=recipe_path,
        supervisor_pid=os.getpid(),
        phase=phase,
        plan=msgspec.structs.replace(plan, instances=[inst.spec for inst in instances]),
        records=records,
        control=control,
        token=token,
        slurm_job=slurm_job,
        error=error,
    )


async def register_control(plan: Plan, control_url: str, lease_ttl: float) -> Discovery | None:
    """Put the control endpoint in discovery as ``{ns}/instances/supervisor/control/NAME``
    so that Prometheus targets generated from discovery include its ``/metrics``. Best
    effort: the deployment serves without it (None)."""
    record = wire.InstanceRecord(
        instance_id=plan.name,
        component=Component.SUPERVISOR,
        endpoint=Endpoint.CONTROL,
        address=control_url,
        host=socket.gethostname(),
        pid=os.getpid(),
        model=plan.model,
        metrics_url=f"{control_url}/metrics",
    )
    key = keys.instance_key(plan.namespace, Component.SUPERVISOR, Endpoint.CONTROL, plan.name)
    disc = Discovery(store_from_url(plan.discovery_url), lease_ttl=lease_ttl, connect_timeout=10.0)
    try:
        await disc.start()
        await disc.register(key, wire.encode_json(record))
    except Exception as exc:
        log.warning("could not register the control endpoint in discovery: %s", exc)
        await disc.close()
        return None
    return disc
