"""Small facts about addresses, shared by the recipe rules and the plan."""

from __future__ import annotations

import contextlib
import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve(name: str) -> str | None:
    """``name``'s IPv4 address here; None if it does not resolve."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def source_address(peer: str) -> str | None:
    """The local address this machine sends from to reach the IPv4 address ``peer`` (a UDP
    ``connect``: the kernel picks the route, no packet is sent); None without a route or
    for anything but an IPv4 address (no name lookup, which may wait on DNS)."""
    try:
        ipaddress.IPv4Address(peer)
    except ValueError:
        return None
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect((peer, 9))
        address: str = udp.getsockname()[0]
        return address
    return None
