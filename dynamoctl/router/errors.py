"""Router failures, typed so that the frontend can map each one to its HTTP answer."""

from __future__ import annotations


class RouterError(Exception):
    """Base class of the router's errors."""


class UnknownMode(RouterError, ValueError):
    """No routing mode has that name; the message lists the valid ones."""


class NoWorkers(RouterError):
    """No worker serves the model (none registered, or all excluded): 503 at once."""


class AllWorkersBusy(RouterError):
    """Every candidate worker is over a busy threshold: queue the request (bounded) and
    retry, then answer 503 with Retry-After."""

    def __init__(self, busy: int) -> None:
        super().__init__(f"all {busy} worker(s) are busy")
        self.busy = busy
        """How many workers were considered, all busy."""
