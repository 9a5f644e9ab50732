"""Limits every HTTP server of ours applies (:class:`dynamoctl.component.http.BoundServer`):
the frontend takes them from its recipe section; workers' and routers' servers, which
only answer probes and scrapes, keep the defaults."""

from __future__ import annotations

from pydantic import Field

from dynamoctl.settings.base import Options


class HttpLimitSettings(Options):
    """Bounds on what one client may make the HTTP server hold: a larger or slower
    request is refused and its connection closed."""

    max_body_bytes: int = Field(default=4 << 20, ge=1024)
    """Largest request body; larger is 413 (before it is read, when declared)."""
    max_header_bytes: int = Field(default=64 << 10, ge=1024)
    """Largest request line plus headers; larger is 431."""
    max_headers: int = Field(default=100, ge=8)
    """Most header fields in a request; more is 431."""
    header_timeout: float = Field(default=10.0, ge=0.1)
    """Seconds a client has to send a request's headers, from when it connects (on a
    kept-alive connection: from the request's first byte); a slower one is disconnected,
    so that slow clients cannot hold connections open (slowloris)."""
    body_timeout: float = Field(default=60.0, ge=0.1)
    """Seconds from the end of a request's headers to the end of its body; a slower
    client is disconnected."""
