"""The model staged onto every node of the allocation before any engine starts (recipe
``model.cache.stage_ahead``), with Slurm's own broadcast:

1. this host (the batch script's, the allocation's first node) stages the model into its
   own cache as a worker would: one read of the shared path, SHA-256 taken as it reads;
2. one step with a task per node asks each node whether it holds the entry already
   (``python -m dynamoctl.modelcache SOURCE --probe``; it makes the cache directory);
3. if one does not, ``sbcast`` sends each file of this host's copy, and its manifest, to
   every node of the job (Slurm's tree, ``TreeWidth``), as flat files in the cache
   directory (:mod:`dynamoctl.modelcache.receive`);
4. one more step checks what arrived on each node against the manifest (sizes, SHA-256)
   and moves it into place (``--adopt``); a node that held the entry drops it.

A restart in the same allocation, or a new allocation on nodes that kept their disks,
stops after step 2. The workers then find the model in their node's cache. A failure
names the node and why. docs/operations.md, "Model cache", "Slurm: sbcast".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.slurm.jobs import run_client
from dynamoctl.modelcache.cache import NodeCache, StagingError
from dynamoctl.modelcache.receive import broadcast_files
from dynamoctl.settings.base import to_argv
from dynamoctl.settings.model_cache import ModelCacheSettings

log = logging.getLogger(__name__)

STEP_NAME = "dynamoctl:stage"
PARALLEL_SBCASTS = 4
"""``sbcast`` calls at once, one file each: a call costs a credential and a fan-out set-up
(about a second here), which a model of many files would otherwise pay in series."""
STAGING_TIMEOUT_S = 3600.0
"""Bound on one broadcast of a file and on one step that checks every node's copy (it
reads the whole model): hundreds of GiB over a slow network."""


async def stage_allocation(
    job: str,
    nodes: Sequence[str],
    sources: Sequence[str],
    settings: ModelCacheSettings,
    *,
    env: Mapping[str, str],
    step_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Every source in every node's cache; what happened (seconds, nodes broadcast to)
    for the supervisor's log. ``step_args``: the interpreter and its arguments up to
    ``-m`` as the steps run it (a container's options first)."""
    began = time.monotonic()
    allocation = _Allocation(job, nodes, settings, env, step_args)
    report: dict[str, Any] = {"nodes": list(nodes), "sources": {}}
    for source in sources:
        report["sources"][source] = await _stage_source(allocation, source)
    report["seconds"] = round(time.monotonic() - began, 3)
    return report


@dataclass(frozen=True)
class _Allocation:
    """What every step and broadcast of one staging runs with."""

    job: str
    nodes: Sequence[str]
    settings: ModelCacheSettings
    env: Mapping[str, str]
    step_args: Sequence[str]


async def _stage_source(allocation: _Allocation, source: str) -> dict[str, Any]:
    settings = allocation.settings
    began = time.monotonic()
    try:
        entry = await asyncio.to_thread(NodeCache(settings).stage, source)
    except StagingError as exc:
        raise LaunchError(f"model.cache.stage_ahead: {exc}") from exc
    try:
        held = await _each_node(allocation, source, "--probe")
        missing = sorted(node for node, out in held.items() if not out["hit"])
        if not missing:
            log.info("%s: already in the cache on all %d nodes", source, len(allocation.nodes))
            return {"broadcast": False, "missing": [], "seconds": _since(began)}
        log.info("%s: sbcast to the job's nodes (missing on %s)", source, ", ".join(missing))
        sent = time.monotonic()
        root = Path(settings.dir or "")
        *files, manifest = broadcast_files(entry)
        calls = asyncio.Semaphore(PARALLEL_SBCASTS)

        async def send(local: Path, name: str) -> None:
            async with calls:
                await _sbcast(allocation, local, root / name)

        await asyncio.gather(*(send(local, name) for local, name in files))
        await _sbcast(allocation, manifest[0], root / manifest[1])  # last: adopt needs it
        sbcast_s = _since(sent)
        adopted = await _each_node(allocation, source, "--adopt")
    finally:
        entry.release()
    log.info("%s: staged on %s in %.1f s (sbcast %.1f s)", source, missing, _since(began), sbcast_s)
    return {
        "broadcast": True,
        "missing": missing,
        "from": {node: out["from"] for node, out in adopted.items()},
        "sbcast_s": sbcast_s,
        "seconds": _since(began),
    }


async def _each_node(allocation: _Allocation, source: str, mode: str) -> dict[str, dict[str, Any]]:
    """``python -m dynamoctl.modelcache SOURCE MODE`` on every node, one step of one task
    each; each node's JSON line. A node that failed or did not answer is a LaunchError
    naming it and its last line."""
    job, nodes = allocation.job, allocation.nodes
    argv = [
        "srun",
        f"--jobid={job}",
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--overlap",
        "--export=ALL",
        "--label",  # "TASK: " before each line: which node said it
        f"--job-name={STEP_NAME}",
        *allocation.step_args,
        "-m",
        "dynamoctl.modelcache",
        source,
        *to_argv(allocation.settings),
        mode,
    ]
    code, out, err = await run_client(argv, allocation.env, STAGING_TIMEOUT_S)
    said: dict[str, dict[str, Any]] = {}
    last: dict[str, str] = {}
    for line in (out + err).splitlines():
        task, _, text = line.partition(": ")
        if text.startswith("{"):
            found = json.loads(text)
            said[found["node"]] = found
        elif text.strip():
            last[task.strip()] = text.strip()
    lost = [node for node in nodes if node not in said]
    if lost:
        why = "; ".join(f"task {t}: {line}" for t, line in sorted(last.items())) or err.strip()
        raise LaunchError(
            f"model.cache.stage_ahead ({mode.removeprefix('--')}) failed on "
            f"{', '.join(lost)} (srun exit {code}): {why[-800:]}"
        )
    return said


async def _sbcast(allocation: _Allocation, local: Path, dest: Path) -> None:
    argv = ["sbcast", f"--jobid={allocation.job}", "--force", "--preserve", str(local), str(dest)]
    code, _, err = await run_client(argv, allocation.env, STAGING_TIMEOUT_S)
    if code != 0:
        raise LaunchError(
            f"model.cache.stage_ahead: sbcast {local} -> {dest} failed (exit {code}): "
            f"{err.strip()[-500:]}"
        )


def _since(began: float) -> float:
    return round(time.monotonic() - began, 3)
