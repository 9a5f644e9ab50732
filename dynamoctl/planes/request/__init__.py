"""The request plane: workers bind a :class:`RequestServer` (ROUTER), frontends stream from
them through one :class:`RequestClient` (a DEALER per server). See docs/planes.md."""

from dynamoctl.planes.request.client import RequestClient, StreamProbe
from dynamoctl.planes.request.errors import (
    ClientClosedError,
    NotAccepting,
    Overloaded,
    PeerDeadError,
    RemoteError,
    RequestPlaneError,
    UnknownEndpointError,
)
from dynamoctl.planes.request.server import Handler, RequestServer

__all__ = [
    "ClientClosedError",
    "Handler",
    "NotAccepting",
    "Overloaded",
    "PeerDeadError",
    "RemoteError",
    "RequestClient",
    "RequestPlaneError",
    "RequestServer",
    "StreamProbe",
    "UnknownEndpointError",
]
