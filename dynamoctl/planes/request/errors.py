"""Typed failures of a request-plane stream, as the consumer of the stream sees them."""

from __future__ import annotations

from dynamoctl.wire import ErrorCode


class RequestPlaneError(Exception):
    """Base of every request-plane failure."""


class RemoteError(RequestPlaneError):
    """The server answered with an error: its handler raised, or the request was invalid.
    ``str(exc)`` is the server's message."""


class UnknownEndpointError(RemoteError):
    """No handler is registered under the requested endpoint name on that server."""


class Overloaded(RequestPlaneError):
    """The server is at its ``max_inflight`` bound; nothing was started, so retrying on
    another worker is safe."""


class NotAccepting(RequestPlaneError):
    """Raised by a handler, before its first chunk, to refuse a request it has not started
    (a draining worker): the client sees :class:`Overloaded` and may retry elsewhere."""


class PeerDeadError(RequestPlaneError):
    """The server stopped answering heartbeats within ``heartbeat_timeout``, restarted, or
    the stream broke in transit. Chunks received before this are valid; the request may
    have been partly executed (migration re-issues it with the tokens so far)."""


class ClientClosedError(RequestPlaneError):
    """The client (or its connection to that address) was closed while the stream was
    open."""


def from_code(code: ErrorCode, message: str) -> RequestPlaneError:
    """The exception a consumer sees for an :class:`~dynamoctl.wire.Error` message."""
    if code == ErrorCode.OVERLOADED:
        return Overloaded(message)
    if code == ErrorCode.UNKNOWN_ENDPOINT:
        return UnknownEndpointError(message)
    if code == ErrorCode.UNKNOWN_STREAM:
        return PeerDeadError(message)
    return RemoteError(message)
