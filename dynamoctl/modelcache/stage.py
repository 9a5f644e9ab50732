"""What a worker does before its engine starts: the weights directory its engine argument
names (the engine's spec says which: ``EngineSpec.weights_arg``) staged into the node's
cache, and the argument pointed at the copy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamoctl.engines.registry import engine_spec
from dynamoctl.modelcache.cache import Entry, NodeCache, StagingError
from dynamoctl.settings.model_cache import ModelCacheSettings
from dynamoctl.wire.model_cache import StagingReport

log = logging.getLogger(__name__)


@dataclass
class Staged:
    """The engine's arguments after staging, and what staging did."""

    engine_options: dict[str, Any]
    report: StagingReport | None
    """None: no cache configured, or nothing to stage."""
    entry: Entry | None = None
    """The entry in use (its shared lock is held while this lives)."""


def stage_engine_weights(
    engine: str, options: dict[str, Any], settings: ModelCacheSettings, node: str | None = None
) -> Staged:
    """Stage the directory ``options[weights_arg]`` names and point the argument at the
    copy; a failure raises :class:`StagingError` unless ``fallback_to_shared``."""
    spec = engine_spec(engine)
    key = spec.weights_arg
    source = options.get(key) if key is not None else None
    if settings.dir is None or key is None or source is None:
        return Staged(dict(options), None)
    cache = NodeCache(settings, node)
    began = time.monotonic()
    try:
        if not Path(str(source)).is_dir():
            raise cache.error(
                Path(str(source)),
                "not a directory on this node (a model id is downloaded by the engine "
                "itself; the cache stages a directory)",
            )
        entry = cache.stage(str(source))
    except StagingError as exc:
        if not settings.fallback_to_shared:
            raise
        log.warning("%s; reading the shared path (fallback_to_shared)", exc)
        report = StagingReport(
            weights_from="shared",
            path=str(source),
            staging_s=round(time.monotonic() - began, 3),
            hit=False,
            reason=exc.reason,
        )
        return Staged(dict(options), report)
    staged = {**options, **spec.cached_weights_args, key: str(entry.model_dir)}
    if key == "model" and options.get("tokenizer") is None:
        # the model card names the tokenizer the frontend loads, on its own host: the
        # shared path, which every host sees (the node's copy is the node's alone)
        staged["tokenizer"] = str(source)
    report = StagingReport(
        weights_from="cache",
        path=str(entry.model_dir),
        staging_s=round(time.monotonic() - began, 3),
        hit=entry.hit,
        bytes_copied=0 if entry.hit else entry.manifest.bytes,
    )
    log.info(
        "engine reads %s from the node cache (%s, %.1f s)",
        source,
        "hit" if entry.hit else "staged",
        report.staging_s,
    )
    return Staged(staged, report, entry)
