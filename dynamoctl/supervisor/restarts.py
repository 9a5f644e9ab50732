"""The restart policy: a failed instance is FAILED, then after a backoff started again,
within a restart budget (docs/operations.md, "Instance states").

While ``up`` is still starting, a failure is not retried: ``up`` rolls back and reports
it, because a typo in engine arguments would otherwise crash-loop. The supervisor hands it
a :class:`~dynamoctl.supervisor.view.RestartView`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from dynamoctl.supervisor.instance import Failure, Instance
from dynamoctl.supervisor.view import RestartView
from dynamoctl.wire.states import State

log = logging.getLogger(__name__)


class Restarts:
    """Decides, for each failure of an instance, whether and when it starts again."""

    def __init__(self, deployment: RestartView) -> None:
        self.deployment = deployment

    async def after_failure(self, inst: Instance, failure: Failure) -> bool:
        """Record the failure (FAILED), then wait out the backoff (BACKOFF): True to start
        again (or to stop, if asked meanwhile), False when it stays FAILED."""
        s = self.deployment.settings
        now = time.monotonic()
        if inst.ready_since is not None and now - inst.ready_since >= s.budget_window:
            # READY for a whole budget window: not a crash loop, so the delays start over,
            # as the budget does (failures older than the window no longer count).
            inst.backoff.reset()
        inst.failures.append(now)
        while inst.failures and inst.failures[0] < now - s.budget_window:
            inst.failures.popleft()
        inst.reason, inst.message = failure
        # On a node of an extra job that ended: stopped, not restarted.
        if not self.deployment.starting:
            await self.deployment.capacity.check_host(inst.spec.host)
        asked = inst.stop_asked.is_set()  # stopped meanwhile: no budget to spend
        spent = not self.deployment.starting and not asked and len(inst.failures) > s.restart_budget
        if spent:
            inst.message += (
                f"; restart budget spent ({s.restart_budget} restarts in "
                f"{s.budget_window:g} s): not restarting"
            )
        log.warning("%s failed: %s", inst.spec.name, inst.message)
        self.deployment.transition(inst, State.FAILED, inst.message)
        if self.deployment.starting or spent:
            return False  # while starting, up rolls back instead of crash-looping
        delay = inst.backoff.next()
        self.deployment.transition(inst, State.BACKOFF, f"restart in {delay:.2f} s")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(inst.stop_asked.wait(), delay)
        if inst.wanted:
            inst.restarts += 1
            spec = inst.spec
            self.deployment.restart_counts[(spec.name, spec.component, spec.pool, inst.reason)] += 1
        return True
