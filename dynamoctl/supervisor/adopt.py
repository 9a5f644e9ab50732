"""Taking a deployment back from a supervisor that died (docs/operations.md, "Restarting
the supervisor").

``dynamoctl up`` finds the dead supervisor's process records in ``state.json``. Each
instance of the new plan whose recorded spec is the same, and whose keeper still runs,
is adopted: the launcher attaches a lifeline to its keeper, and its life begins at
watching (STARTING until probes say READY) instead of a launch. Everything else the dead
supervisor left (its keeper's instance is not in the plan any more, or was planned
differently, or a keeper that cannot be attached to) is reaped and, if planned, started
afresh.
"""

from __future__ import annotations

import asyncio
import logging

from dynamoctl.launch.api import InstanceSpec, Launched, Launcher, LaunchError, ProcessRecord
from dynamoctl.supervisor.plan import Plan
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
