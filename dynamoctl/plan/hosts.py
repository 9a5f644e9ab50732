"""Hosts of a plan: the name a launcher reaches a host by, and the address its components
bind and advertise.

Components listen on, and put into discovery, an IPv4 *address*: ZeroMQ binds only
addresses or interface names (``tcp://node1:0`` fails), etcd refuses host names in its
listen URLs, and vLLM's NIXL side channel binds the host it advertises. People read
*names*: ``status``, logs, the endpoint URL and etcd's advertised client URL use them.

Each name is resolved once, on the machine that builds the plan (inside a Slurm allocation
that is the first node; for SSH the supervisor's machine), unless the recipe (or a dry
run's ``--resolve``) gives its address. A name that does not resolve, or that resolves to
loopback while the deployment spans several hosts (Debian maps a machine's own name to
127.0.1.1), is refused before anything starts: the other hosts could not reach it.

A Slurm dry run outside an allocation knows no nodes: its hosts are ``node0``, ``node1``,
... with the placeholder address ``<node0>``, and the text says so.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

import msgspec

from dynamoctl.util.net import is_loopback

LOCALHOST = "127.0.0.1"


class HostError(ValueError):
    """A host cannot be given an address; the message names the host and what to change."""


class Host(msgspec.Struct, frozen=True):
    name: str
    """What the launcher reaches it by (SSH destination, Slurm node) and people read."""
    address: str
    """IPv4 address its components bind and advertise (``<name>`` when symbolic)."""

    @property
    def symbolic(self) -> bool:
        """A placeholder for a Slurm node not known yet (a dry run outside an allocation)."""
        return self.address.startswith("<")


def symbolic_host(name: str) -> Host:
    return Host(name, f"<{name}>")


def resolve_host(name: str, overrides: Mapping[str, str], *, field: str, spans: bool) -> Host:
    """``name`` with its address: from ``overrides``, else resolved here (IPv4).

    ``field`` is the recipe field that named the host, for the error; ``spans``: the
    deployment has several hosts, so a loopback address is refused."""
    address = overrides.get(name)
    if address is None:
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise HostError(
                f"{field}: host {name!r} does not resolve on this machine "
                f"({getattr(exc, 'strerror', None) or exc}); fix its DNS or /etc/hosts entry, "
                f"or give its address (target.addresses: {{{name}: ADDRESS}})"
            ) from None
        address = str(infos[0][4][0])
    if spans and is_loopback(address):
        raise HostError(
            f"{field}: host {name!r} resolves to the loopback address {address}, which the "
            "other hosts of this deployment cannot reach; map the name to the host's network "
            f"address in DNS or /etc/hosts, or give it (target.addresses: {{{name}: ADDRESS}})"
        )
    return Host(name, address)


def parse_resolve(entries: list[str]) -> dict[str, str]:
    """``NAME=ADDRESS`` entries (``up --dry-run --resolve``) as a mapping."""
    resolved: dict[str, str] = {}
    for entry in entries:
        name, sep, address = entry.partition("=")
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise HostError(f"--resolve {entry!r}: expected NAME=IPV4ADDRESS")
        resolved[name] = address
    return resolved
