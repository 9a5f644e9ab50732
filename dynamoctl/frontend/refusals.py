"""Refused requests: counted by status in ``dynamoctl_frontend_requests_total`` and logged,
so that a client that only shows "400 Bad Request" can be diagnosed from the server.

The log says what was refused and why (method, path, status, ``param``, the error's
message), never the body or a header. It is rate-limited: a client that repeats a bad
request in a loop gets :data:`BURST` lines per :data:`WINDOW` seconds, then one line
saying how many more were not logged. The ``model`` label is empty for a request refused
before it was accepted: the name a client sent is not a label (it could be anything).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.metrics import FrontendMetrics

log = logging.getLogger(__name__)

BURST = 20
"""Refusals logged per window; the rest are counted and summed up in one line."""
WINDOW = 60.0
"""Seconds of a rate-limiting window."""
MESSAGE_CHARS = 300
"""An error's message is logged cut to this (it may quote a client's key or model name)."""

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/tokenizer_info": "tokenizer_info",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/embeddings": "embeddings",
}
"""The ``endpoint`` label of a path; any other path is ``other`` (a 404's path is the
client's choice, not a label)."""


def endpoint_of(path: str) -> str:
    return ENDPOINTS.get(path, "other")


class RefusalLog:
    """At most ``burst`` lines per ``window`` seconds, then a count of those dropped."""

    def __init__(
        self,
        burst: int = BURST,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.window, self.clock = burst, window, clock
        self.started = clock()
        self.logged = 0
        self.dropped = 0

    def refused(self, where: str, error: OpenAIError) -> bool:
        """Log one refusal of ``where`` (method and path) unless this window's lines are
        spent; whether it was logged."""
        now = self.clock()
        if now - self.started >= self.window:
            if self.dropped:
                log.warning("%d more refused requests were not logged in %.0f s",
                            self.dropped, now - self.started)  # fmt: skip
            self.started, self.logged, self.dropped = now, 0, 0
        if self.logged >= self.burst:
            self.dropped += 1
            return False
        self.logged += 1
        message = error.message[:MESSAGE_CHARS]
        log.warning("refused %s: %d %s (param %s): %s", where[:200], error.status, error.type,
                    error.param, message)  # fmt: skip
        return True


LINES = RefusalLog()
"""The process's refusal log (one frontend per process)."""


class Refusals:
    """Counts and logs every refused request of one frontend."""

    def __init__(self, metrics: FrontendMetrics, lines: RefusalLog = LINES) -> None:
        self.metrics = metrics
        self.lines = lines

    def refused(self, method: str, path: str, error: OpenAIError, model: str = "") -> None:
        self.metrics.requests.labels(model, endpoint_of(path), str(error.status)).inc()
        self.lines.refused(f"{method} {path}", error)
