"""Taking a deployment back from a supervisor that died (docs/operations.md, "Restarting
the supervisor").

``dynamoctl up`` finds the dead supervisor's process records in ``state.json``. Each
instance of the new plan whose recorded spec is the same, and whose keeper still runs,
is adopted: the launcher attaches a lifeline to its keeper, and its life begins at
watching (STARTING until probes say READY) instead of a launch. Everything else the dead
supervisor left (its keeper's instance is not in the plan any more, or was planned
differently, or a keeper that cannot be attached to) is reaped and, if planned, started
afresh.

A multi-node replica is taken back whole or not at all: when one of its members cannot
be adopted (it died while no supervisor watched), the members that could are reaped too,
and the new supervisor starts the gang afresh; a leader adopted beside a freshly started
follower would wait forever for a rank that never joins (docs/operations.md,
"Multi-node replicas").
"""

from __future__ import annotations

import asyncio
import logging

from dynamoctl.launch.api import (
    InstanceSpec,
    Launched,
    Launcher,
    LaunchError,
    ProcessRecord,
    stop,
)
from dynamoctl.plan.placed import Plan
from dynamoctl.supervisor.rundir import RunDir

log = logging.getLogger(__name__)

REAP_GRACE = 5.0
"""Seconds a leftover that is not adopted gets between SIGTERM and SIGKILL."""


async def take_over(plan: Plan, run_dir: RunDir, launcher: Launcher) -> dict[str, Launched]:
    """Adopt what a dead supervisor of this deployment left running; reap the rest. The
    adopted processes, by instance name."""
    state = run_dir.read_state()
    if state is None or not state.records:
        return {}
    planned = {spec.name: spec for spec in plan.instances}
    recorded = {spec.name: spec for spec in state.plan.instances} if state.plan else {}
    names = list(state.records)
    outcomes = await asyncio.gather(
        *(
            _adopt_one(launcher, run_dir, name, state.records[name], planned, recorded)
            for name in names
        )
    )
    adopted = {name: proc for name, proc in zip(names, outcomes, strict=True) if proc}
    await _reap_broken_gangs(plan, adopted)
    state.records = {name: state.records[name] for name in adopted}
    run_dir.write_state(state)  # what was reaped is no longer recorded
    return adopted


async def _adopt_one(
    launcher: Launcher,
    run_dir: RunDir,
    name: str,
    record: ProcessRecord,
    planned: dict[str, InstanceSpec],
    recorded: dict[str, InstanceSpec],
) -> Launched | None:
    where = f"{name} (pid {record.pid} on {record.host})"
    spec = planned.get(name)
    if spec is None:
        why = "not in the plan"
    elif recorded.get(name) != spec:
        why = "planned differently now"
    else:
        try:
            proc = await launcher.adopt(record, run_dir.log_of(name))
        except LaunchError as exc:
            proc, why = None, str(exc)
        else:
            why = "its keeper is gone or cannot be adopted"
        if proc is not None:
            log.info("adopted %s", where)
            return proc
    try:
        if await launcher.reap(record, REAP_GRACE):
            log.warning("stopped %s, left by the previous supervisor: %s", where, why)
    except LaunchError as exc:
        log.warning("could not stop %s, left by the previous supervisor: %s", where, exc)
    return None


async def _reap_broken_gangs(plan: Plan, adopted: dict[str, Launched]) -> None:
    """Drop from ``adopted`` (and stop) every member of a gang not adopted whole."""
    gangs: dict[str, list[str]] = {}
    for spec in plan.instances:
        if spec.gang:
            gangs.setdefault(spec.gang, []).append(spec.name)
    for gang, members in gangs.items():
        lost = [name for name in members if name not in adopted]
        kept = [name for name in members if name in adopted]
        if not lost or not kept:
            continue
        why = f"gang {gang} lost {', '.join(lost)}: it restarts whole"
        for name in kept:
            proc = adopted.pop(name)
            await stop(proc, REAP_GRACE)  # through the lifeline just attached
            log.warning(
                "stopped %s (pid %s on %s), left by the previous supervisor: %s",
                name,
                proc.record.pid,
                proc.record.host,
                why,
            )
