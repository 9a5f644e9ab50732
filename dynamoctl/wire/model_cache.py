"""What a node's model cache keeps beside each staged model (``manifest.json``, written last,
so an entry without it is a copy that never finished) and what a worker reports of its
staging (docs/operations.md, "Model cache")."""

from __future__ import annotations

from typing import Literal

import msgspec

WeightsFrom = Literal["cache", "shared"]
"""Where an engine read its weights: the node's cache, or the shared path as given."""


class CachedFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a staged model."""

    path: str
    """Relative to the model directory (``/``-separated)."""
    size: int
    """Bytes."""
    sha256: str | None = None
    """Hex digest for the files an engine trusts blindly (``*.safetensors``, their index,
    ``config.json`` and the tokenizer's JSON); None for the rest (sizes only)."""


class CacheManifest(msgspec.Struct, frozen=True, kw_only=True):
    """A complete, verified cache entry."""

    source: str
    """The shared path it was copied from (absolute)."""
    revision: str
    """The source's content fingerprint when copied (its files' names, sizes and
    modification times, hashed): a changed source is a new entry."""
    files: list[CachedFile]
    bytes: int
    """Sum of the files' sizes."""
    staging_s: float
    """Seconds the copy and its verification took."""
    node: str
    """Host name of the node that staged it."""


class StagingReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker's staging did before its engine started (its ``/health``)."""

    weights_from: WeightsFrom
    """Where the engine reads its weights."""
    path: str
    """The directory the engine was given."""
    staging_s: float
    """Seconds spent staging (waiting for another start's copy included; 0 on a hit)."""
    hit: bool
    """The entry was already in the cache (nothing copied)."""
    bytes_copied: int = 0
    """Bytes read from the shared path by this staging."""
    reason: str | None = None
    """Why the shared path is used after a failed staging (``fallback_to_shared``)."""
