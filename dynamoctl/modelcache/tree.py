"""Coordinated staging: a model onto many nodes with one read of the shared path in all.

The first node copies from the shared path; from then on every node that has the model
serves it (``python -m dynamoctl.modelcache --serve``) and each serves one node that has
not, so the nodes holding it double each wave: 1, 2, 4, 8 .. (``log2(N)`` waves after
the first copy). A node whose peer fails reads the shared path instead (the copy falls
back by itself), so a failure costs a read, never the staging. How each node's command
runs is the caller's: over SSH (:mod:`dynamoctl.launch.ssh`), in a namespace, locally
(:class:`Runner`). docs/operations.md, "Model cache", "Coordinated staging".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynamoctl.modelcache.cache import StagingError
from dynamoctl.settings.base import to_argv
from dynamoctl.settings.model_cache import ModelCacheSettings

PEER_PORT = 29480
"""Port each node serves its copy on while the staging runs (its cluster address)."""


class NodeProcess(Protocol):
    """A command running on a node: its output lines, its input (closed to end it)."""

    async def readline(self) -> bytes: ...
    def close_input(self) -> None: ...
    async def wait(self) -> int: ...


Runner = Callable[[str, list[str]], Awaitable[NodeProcess]]
"""Starts ``argv`` on the node named by the first argument."""


def waves(nodes: Sequence[str]) -> list[list[tuple[str | None, str]]]:
    """``(peer, node)`` copies, wave by wave: the first node from the shared path
    (``None``), then each node that has it serves one that has not."""
    if not nodes:
        return []
    plan: list[list[tuple[str | None, str]]] = [[(None, nodes[0])]]
    holders, left = [nodes[0]], list(nodes[1:])
    while left:
        wave = [(holder, left.pop(0)) for holder in holders if left]
        plan.append(list(wave))
        holders += [node for _, node in wave]
    return plan


@dataclass
class TreeResult:
    """What a coordinated staging did, node by node."""

    seconds: float
    staged: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each node's JSON line from ``python -m dynamoctl.modelcache`` (``from``: where its
    copy came from, ``hit``: already there)."""


async def stage_tree(
    run: Runner,
    nodes: Sequence[str],
    addresses: dict[str, str],
    source: str,
    settings: ModelCacheSettings,
    python: str = "python3",
    port: int = PEER_PORT,
) -> TreeResult:
    """Stage ``source`` into every node's cache (``settings``) wave by wave; each node
    serves its copy on ``addresses[node]:port`` until the last wave is done. Raises
    :class:`StagingError` naming the node when one fails."""
    began = time.monotonic()
    result = TreeResult(seconds=0.0)
    serving: dict[str, NodeProcess] = {}
    try:
        for wave in waves(nodes):
            await asyncio.gather(
                *(
                    _stage_one(run, peer, node, addresses, source, settings, python, port,
                               serving, result)
                    for peer, node in wave
                )
            )  # fmt: skip
    finally:
        for proc in serving.values():
            proc.close_input()
        await asyncio.gather(*(proc.wait() for proc in serving.values()), return_exceptions=True)
    result.seconds = round(time.monotonic() - began, 3)
    return result


async def _stage_one(
    run: Runner,
    peer: str | None,
    node: str,
    addresses: dict[str, str],
    source: str,
    settings: ModelCacheSettings,
    python: str,
    port: int,
    serving: dict[str, NodeProcess],
    result: TreeResult,
) -> None:
    argv = [python, "-m", "dynamoctl.modelcache", source, *to_argv(settings)]
    if peer is not None:
        argv += ["--from-peer", f"http://{addresses[peer]}:{port}/"]
    argv += ["--serve", f"{addresses[node]}:{port}"]
    proc = await run(node, argv)
    serving[node] = proc
    lines = []
    while line := (await proc.readline()).decode(errors="replace").strip():
        if line.startswith("serving "):
            return
        if line.startswith("{"):
            result.staged[node] = json.loads(line)
        else:
            lines.append(line)
    serving.pop(node)
    code = await proc.wait()
    why = lines[-1] if lines else f"exit {code}, no output"
    raise StagingError(node, source, f"the coordinated staging's step failed: {why}")


@dataclass
class _Command:
    proc: asyncio.subprocess.Process

    async def readline(self) -> bytes:
        assert self.proc.stdout is not None
        return await self.proc.stdout.readline()

    def close_input(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    async def wait(self) -> int:
        return await self.proc.wait()


def command_runner(prefix: Callable[[str], list[str]]) -> Runner:
    """A :data:`Runner` that starts ``prefix(node) + argv`` here (``ip netns exec``,
    ``srun -w NODE``, nothing for this host), output and errors merged."""

    async def run(node: str, argv: list[str]) -> NodeProcess:
        proc = await asyncio.create_subprocess_exec(
            *prefix(node),
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return _Command(proc)

    return run
