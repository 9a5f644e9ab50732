"""``python -m dynamoctl.modelcache SOURCE --model-cache-dir DIR``: stage a model directory
into this node's cache and print what happened as JSON (one line); exit 1 with one line
naming node, file and reason when it fails. What a Slurm step per node (``srun
--ntasks-per-node=1``) or an SSH command runs to stage ahead of the engines; a worker
stages by itself (docs/operations.md, "Model cache")."""

from __future__ import annotations

import json
import logging
import time

import typer

from dynamoctl.modelcache.cache import NodeCache, StagingError
from dynamoctl.settings.base import with_options
from dynamoctl.settings.model_cache import ModelCacheSettings


def stage(source: str, *, cache: ModelCacheSettings) -> None:
    """Stage SOURCE into the cache; print the entry as JSON."""
    logging.basicConfig(level=logging.INFO, format="[modelcache] %(message)s")
    if cache.dir is None:
        raise typer.BadParameter("is required", param_hint="--model-cache-dir")
    began = time.monotonic()
    try:
        entry = NodeCache(cache).stage(source)
    except StagingError as exc:
        typer.echo(f"dynamoctl modelcache: {exc}", err=True)
        raise typer.Exit(1) from exc
    entry.release()
    out = {
        "node": entry.manifest.node,
        "path": str(entry.model_dir),
        "hit": entry.hit,
        "bytes": entry.manifest.bytes,
        "staging_s": round(time.monotonic() - began, 3),
    }
    typer.echo(json.dumps(out))


def main() -> None:
    typer.run(with_options(stage, cache=ModelCacheSettings))


if __name__ == "__main__":
    main()
