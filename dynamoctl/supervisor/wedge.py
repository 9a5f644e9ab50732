"""Wedged instances: a process that is there but answers nothing, found and put down.

A frozen or deadlocked process (SIGSTOP, a hung collective, a deadlocked event loop)
keeps its sockets open: nothing closes a connection, the keeper sees no exit, and its
lease may even live on in another thread. What gives it away is that its health probe
gets no answer at all. :class:`WedgeWatch` follows one READY process's probes: a silence
that lasts ``supervision.wedge_timeout`` (counted from its last answer) makes it WEDGED;
a shorter one that ends is logged and counted as a stall survived (docs/operations.md,
"Wedged instances").

A wedged instance, and a worker whose token counter stopped with requests in flight
(``hang_timeout``), is put down with SIGKILL to its whole process group at once: a
stopped process never handles the SIGTERM a drain would send, and it has nothing to
finish (the frontend has already moved its streams away). A gang's followers are killed
with their leader and the gang restarts whole.
"""

from __future__ import annotations

import logging
from collections import Counter

from dynamoctl.launch.api import InstanceSpec, Launched, kill
from dynamoctl.wire.states import RestartReason

log = logging.getLogger(__name__)

PUT_DOWN = frozenset({RestartReason.WEDGE, RestartReason.HANG})
"""Failures after which the process is SIGKILLed at once (WEDGED), not drained."""

SilenceKey = tuple[str, str, str, str]
"""(instance, component, role, outcome) of a probe silence: ``survived`` or ``wedged``."""


class WedgeWatch:
    """The probe silences of one READY process, against ``wedge_timeout``."""

    def __init__(self, spec: InstanceSpec, timeout: float, counts: Counter[SilenceKey]) -> None:
        self.spec = spec
        self.timeout = timeout
        self.counts = counts
        """The supervisor's silence counter (``/metrics``), by outcome."""
        self.last_answer: float | None = None
        """When it last answered a probe; None until READY."""
        self.silent_since: float | None = None

    def ready(self, now: float) -> None:
        """It became READY: its readiness probe was its last answer."""
        self.last_answer, self.silent_since = now, None

    def observe(
        self, silent: bool, now: float, silence: str = "answered no probe"
    ) -> tuple[RestartReason, str] | None:
        """One probe's outcome at ``now``: the failure when it has gone silent for longer
        than ``wedge_timeout``, else None. ``silence`` says what the silence is."""
        if self.last_answer is None:
            return None
        if not silent:
            if self.silent_since is not None:
                log.info(
                    "%s answers its probes again after %.1f s of silence (wedge_timeout "
                    "%g s): a stall, not wedged",
                    self.spec.name, now - self.last_answer, self.timeout,
                )  # fmt: skip
                self._count("survived")
            self.last_answer, self.silent_since = now, None
            return None
        if self.silent_since is None:
            self.silent_since = now
            log.warning(
                "%s %s (silent %.1f s, wedged at %g s)",
                self.spec.name, silence, now - self.last_answer, self.timeout,
            )  # fmt: skip
        silent_for = now - self.last_answer
        if silent_for <= self.timeout:
            return None
        self._count("wedged")
        return RestartReason.WEDGE, (
            f"wedged: {silence} for {silent_for:.1f} s (wedge_timeout {self.timeout:g} s)"
        )

    def _count(self, outcome: str) -> None:
        spec = self.spec
        self.counts[(spec.name, spec.component, spec.pool, outcome)] += 1


async def put_down(proc: Launched) -> int:
    """SIGKILL ``proc``'s whole process group (stopped members included); its status."""
    return await kill(proc)
