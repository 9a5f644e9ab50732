"""One process's watch: probed until it ends or must go, and put down when it must.

A STARTING instance is probed for readiness until it is READY (or STANDBY) or its start
timeout is over; a READY one for health (*alive + answering + progress*), judged for a
hang (``hang_timeout``) or a wedge (``wedge_timeout``, :mod:`dynamoctl.supervisor.wedge`).
Every probe is raced against the process's end and bounded
(:mod:`dynamoctl.supervisor.deadlines`): an exit is seen at once, whatever a probe is
doing. The supervisor hands it a :class:`~dynamoctl.supervisor.view.WatchView`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from dynamoctl.launch.api import Launched, stop
from dynamoctl.supervisor.deadlines import PROBE_DEADLINE_S, Outcome, race
from dynamoctl.supervisor.instance import Failure, Instance
from dynamoctl.supervisor.probes import Health
from dynamoctl.supervisor.startups import staged_seconds
from dynamoctl.supervisor.view import WatchView
from dynamoctl.supervisor.wedge import PUT_DOWN, WedgeWatch, put_down
from dynamoctl.wire.states import RestartReason, State

log = logging.getLogger(__name__)

HUNG_GRACE = 5.0
"""Seconds a hung instance gets between SIGTERM and SIGKILL."""


@dataclass
class HealthTrack:
    """What one process's watch carries from one health probe to the next."""

    wedge: WedgeWatch
    unhealthy_since: float | None = None
    last_tokens: float | None = None


class Watch:
    """Watches the processes of one deployment's instances."""

    def __init__(self, deployment: WatchView) -> None:
        self.deployment = deployment

    async def watch(self, inst: Instance, proc: Launched) -> Failure | None:
        """Probe ``proc`` every ``probe_interval`` until it exits (None), or must be killed
        (why). Every probe is raced against the process's end, so an exit is seen at once
        whatever the probe is doing, and bounded (:data:`PROBE_DEADLINE_S`)."""
        settings = self.deployment.settings
        ended = asyncio.ensure_future(proc.wait())
        wedge = WedgeWatch(inst.spec, settings.wedge_timeout, self.deployment.silence_counts)
        health = HealthTrack(wedge)
        try:
            while not (await asyncio.wait({ended}, timeout=settings.probe_interval))[0]:
                if not inst.wanted:
                    continue  # being stopped: only wait for the exit
                if inst.state is State.STARTING:
                    failure = await self._probe_start(inst, ended, health.wedge)
                else:
                    failure = await self._probe_health(inst, ended, health)
                if failure is not None:
                    return failure
            return None
        finally:
            ended.cancel()

    async def _probe_start(
        self, inst: Instance, ended: asyncio.Future[int], wedge: WedgeWatch
    ) -> Failure | None:
        """One readiness probe of a STARTING instance: READY (or STANDBY) when it passes,
        a failure when its start timeout is over."""
        starts = self.deployment.starts
        ready = await race(self.deployment.prober.ready(inst.spec), ended, PROBE_DEADLINE_S)
        if not inst.wanted or ready is Outcome.ENDED:
            return None  # stopped or ended while probing: that decides
        took = time.monotonic() - (inst.started_at or 0.0)
        if ready is True:
            inst.ready_since = time.monotonic()
            wedge.ready(inst.ready_since)
            starts.ready(
                inst.spec.component, inst.spec.pool, inst.clock, staged_seconds(inst.sample)
            )
            new = State.STANDBY if inst.standby else State.READY
            self.deployment.transition(inst, new, f"{new.lower()} after {took:.1f} s")
            inst.ready.set()
        elif took > (limit := starts.timeout(inst.spec.component, inst.spec.pool)):
            return RestartReason.START_TIMEOUT, f"not ready after {limit:g} s"
        return None

    async def _probe_health(
        self, inst: Instance, ended: asyncio.Future[int], track: HealthTrack
    ) -> Failure | None:
        """One health probe of a READY (or STANDBY) instance. Health is *alive + answering
        + progress*: a worker with requests in flight whose token counter stops is hung
        even though it answers."""
        s = self.deployment.settings
        health = await race(self.deployment.prober.health(inst.spec), ended, PROBE_DEADLINE_S)
        if not inst.wanted or health is Outcome.ENDED:
            return None
        if health is Outcome.LATE:
            silence = f"no probe answer in {PROBE_DEADLINE_S:g} s"
            health = Health(False, silent=True, silence=silence)
        inst.sample = health.sample
        progressing = health.tokens is None or health.tokens != track.last_tokens
        track.last_tokens = health.tokens if health.tokens is not None else track.last_tokens
        now = time.monotonic()
        if (wedged := track.wedge.observe(health.silent, now, health.silence)) is not None:
            return wedged
        if health.silent:
            return None  # no answer at all: wedge_timeout judges it, not hang_timeout
        if health.answering and progressing:
            track.unhealthy_since = None
        elif track.unhealthy_since is None:
            track.unhealthy_since = now
        elif now - track.unhealthy_since > s.hang_timeout:
            what = "no token generated" if health.answering else "answering probes unhealthy"
            reason = RestartReason.HANG if health.answering else RestartReason.PROBE
            return reason, f"hung: {what} for {s.hang_timeout:g} s"
        return None

    async def kill(self, inst: Instance, proc: Launched, failure: Failure) -> None:
        """Put down a process that must go: a wedged or hung one is WEDGED and SIGKILLed
        at once (:mod:`dynamoctl.supervisor.wedge`), any other gets SIGTERM and a grace."""
        if failure[0] in PUT_DOWN and inst.state is State.READY and inst.wanted:
            self.deployment.transition(inst, State.WEDGED, failure[1])
            log.warning("%s %s: SIGKILL to its process group", inst.spec.name, failure[1])
            await put_down(proc)
        else:
            log.warning("%s %s: killing it", inst.spec.name, failure[1])
            await stop(proc, HUNG_GRACE)
