"""The network every member of a multi-node replica (a gang) needs, whatever its engine.

torch's gloo groups (CPU collectives, and the engines' own CPU groups on GPUs) and NCCL's
bootstrap pick their interface from the hostname unless told; where the hostname
resolves to 127.0.0.1 (or to another network than the gang's), every rank connects to
itself and start-up fails or hangs. :func:`set_network_env` names the interface that
owns the member's own address (the engine's host-IP variable, which the plan renders:
vLLM ``VLLM_HOST_IP``, SGLang ``SGLANG_HOST_IP``), looked up on the node itself, so the
plan needs to know nothing of its interfaces. An operator's value (``env`` in the
recipe) is kept. See docs/engines.md, "vLLM gangs on CPU".
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import MutableMapping

import psutil

log = logging.getLogger(__name__)

NETWORK_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""What :func:`set_network_env` fills in from the member's address, when unset."""


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds ``address`` (None if none does)."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def set_network_env(
    address_variable: str, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set ``GLOO_SOCKET_IFNAME`` (and ``NCCL_SOCKET_IFNAME``) to the interface holding
    the address in ``address_variable``, each only where unset; what was set."""
    env = os.environ if environ is None else environ
    address = env.get(address_variable, "")
    name = interface_of(address) if address else None
    if name is None:
        if address:
            log.warning(
                "no interface here holds %s=%s: gloo picks its own", address_variable, address
            )
        return {}
    added = {var: name for var in NETWORK_VARIABLES if not env.get(var)}
    env.update(added)
    if added:
        log.info("gang network: %s (the interface of %s)", added, address)
    return added
