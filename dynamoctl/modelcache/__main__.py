"""``python -m dynamoctl.modelcache SOURCE --model-cache-dir DIR``: stage a model directory
into this node's cache and print what happened as JSON (one line); exit 1 with one line
naming node, file and reason when it fails. What a Slurm step per node (``srun
--ntasks-per-node=1``) or an SSH command runs to stage ahead of the engines; a worker
stages by itself (docs/operations.md, "Model cache").

``--from-peer URL`` copies from a node that serves the entry (falling back to SOURCE);
``--serve ADDRESS:PORT`` then serves this node's entry to others until standard input
closes (a coordinated staging, :mod:`dynamoctl.modelcache.tree`). ``--probe`` and
``--adopt`` are the two steps around a Slurm ``sbcast`` of the entry
(:mod:`dynamoctl.modelcache.receive`)."""

from __future__ import annotations

import json
import logging
import os
import time

import typer

from dynamoctl.modelcache.cache import NodeCache, StagingError
from dynamoctl.modelcache.peer import serve_entry
from dynamoctl.modelcache.receive import adopt, probe
from dynamoctl.settings.base import with_options
from dynamoctl.settings.model_cache import ModelCacheSettings


def stage(
    source: str,
    from_peer: str | None = typer.Option(
        None, help="URL of a node serving the entry (--serve there): copy from it."
    ),
    serve: str | None = typer.Option(
        None, help="ADDRESS:PORT: once staged, serve the entry there until stdin closes."
    ),
    probe_only: bool = typer.Option(
        False, "--probe", help="Copy nothing: say whether this node holds the entry."
    ),
    adopt_broadcast: bool = typer.Option(
        False, "--adopt", help="Take the entry broadcast into the cache (sbcast), checked."
    ),
    *,
    cache: ModelCacheSettings,
) -> None:
    """Stage SOURCE into the cache; print the entry as JSON."""
    logging.basicConfig(level=logging.INFO, format="[modelcache] %(message)s")
    if cache.dir is None:
        raise typer.BadParameter("is required", param_hint="--model-cache-dir")
    began = time.monotonic()
    node_cache = NodeCache(cache, node=os.environ.get("SLURMD_NODENAME"))  # Slurm's name
    try:
        if probe_only:
            hit = probe(node_cache, source)
            typer.echo(json.dumps({"node": node_cache.node, "hit": hit}))
            return
        if adopt_broadcast:
            entry = adopt(node_cache, source)
        else:
            entry = node_cache.stage(source, peer=from_peer)
    except StagingError as exc:
        typer.echo(f"dynamoctl modelcache: {exc}", err=True)
        raise typer.Exit(1) from exc
    out = {
        "node": entry.manifest.node,
        "path": str(entry.model_dir),
        "hit": entry.hit,
        "from": entry.origin,
        "bytes": entry.manifest.bytes,
        "staging_s": round(time.monotonic() - began, 3),
    }
    typer.echo(json.dumps(out))
    if serve is not None:
        address, _, port = serve.rpartition(":")
        if not address or not port.isdigit():
            raise typer.BadParameter(f"{serve!r} should be ADDRESS:PORT", param_hint="--serve")
        serve_entry(entry.path, address, int(port))  # the entry stays held meanwhile
    entry.release()


def main() -> None:
    typer.run(with_options(stage, cache=ModelCacheSettings))


if __name__ == "__main__":
    main()
