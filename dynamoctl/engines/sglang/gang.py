"""SGLang's side of a multi-node replica (a gang), as SGLang's own launcher runs it.

SGLang spreads one engine over ``--nnodes`` nodes: every node runs its share of the
scheduler ranks, all meeting at ``--dist-init-addr`` (torch's store on the leader), and
only node rank 0 runs the tokenizer, detokenizer and API. ``Engine._launch_subprocesses``
(``python/sglang/srt/entrypoints/engine.py``) gives a node of rank >= 1 exactly that:
it starts the node's schedulers, waits until they are ready, then (unless
``SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0``, the embedding API's opt-out) serves a dummy
health check on ``--host/--port`` and blocks until its schedulers exit. The follower
runs that path in this process (``sglang.Engine`` with ``node_rank`` >= 1), so it ends
when its schedulers do, the way ``python -m sglang.launch_server --node-rank k`` does.

The leader is the ordinary worker (:class:`~dynamoctl.engines.sglang.engine.SglangEngine`)
with ``node_rank`` 0. Every member names the interface of its ``SGLANG_HOST_IP`` (the
address SGLang advertises for its cross-node rendezvous, which the plan renders) for
gloo and NCCL (:mod:`dynamoctl.engines.gang_network`). Only :func:`run_follower`
imports SGLang. See docs/engines.md, "Multi-node replicas".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from dynamoctl.engines import gang_network
from dynamoctl.engines.sglang import args as sargs
from dynamoctl.engines.sglang.spec import HOST_IP_VARIABLE
from dynamoctl.wire.engine_args import parse_engine_args

log = logging.getLogger(__name__)

BLOCK_VARIABLE = "SGLANG_BLOCK_NONZERO_RANK_CHILDREN"
"""Set to "0", a rank >= 1 returns at once instead of serving until its schedulers end."""


def is_gang(options: Mapping[str, object]) -> bool:
    """Whether SGLang engine ``options`` span several nodes."""
    return int(str(options.get("nnodes", 1))) > 1


def set_network_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """:func:`dynamoctl.engines.gang_network.set_network_env` for ``SGLANG_HOST_IP``."""
    return gang_network.set_network_env(HOST_IP_VARIABLE, environ)


def follower_server_args(argv: Sequence[str]) -> dict[str, Any]:
    """``sglang.Engine`` keywords of a follower from its engine arguments: the leader's
    translation (:func:`~dynamoctl.engines.sglang.args.server_args`, so both sides load
    the same configuration) without a KV-event publisher of its own, checked to be a
    follower's (``nnodes`` > 1, ``node_rank`` in 1..nnodes-1, ``dist_init_addr``)."""
    options = parse_engine_args(argv)
    args = sargs.server_args(options, None)
    nnodes, rank = int(args.get("nnodes", 1)), int(args.get("node_rank", 0))
    if not 1 <= rank < nnodes:
        raise ValueError(
            f"an SGLang follower needs --node-rank between 1 and --nnodes - 1 "
            f"(got node rank {rank} of {nnodes})"
        )
    if not args.get("dist_init_addr"):
        raise ValueError("an SGLang follower needs --dist-init-addr (the leader's ADDRESS:PORT)")
    args.setdefault("log_level", "info")  # its log is the follower's only account
    return args


def run_follower(argv: Sequence[str], environ: MutableMapping[str, str] | None = None) -> int:
    """Run this node's scheduler ranks until they exit; the exit status (1: they ended,
    which breaks the gang)."""
    import sglang

    env = os.environ if environ is None else environ
    args = follower_server_args(argv)
    set_network_env(env)
    if env.pop(BLOCK_VARIABLE, None) == "0":
        log.info("ignoring %s=0: a follower serves until its schedulers exit", BLOCK_VARIABLE)
    engine = sglang.Engine(**args)  # returns once this node's schedulers have exited
    log.error("SGLang's schedulers on node rank %s exited", args["node_rank"])
    engine.shutdown()
    return 1


def follow_leader(label: str, host: str, port: int, left: float, argv: Sequence[str]) -> int:
    """``dynamoctl follower``'s SGLang side: this node's schedulers, until they exit."""
    return run_follower(argv)
