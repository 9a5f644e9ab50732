"""The node-local model cache, declared once: the recipe's ``model.cache`` section and
``dynamoctl worker``'s ``--model-cache-*`` flags (docs/operations.md, "Model cache")."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from dynamoctl.settings.base import Options

WhenFull = Literal["evict", "refuse"]
CacheVerify = Literal["sizes", "checksums"]


class ModelCacheSettings(Options):
    """Where each node keeps its copies of the model's weights, and how many."""

    FLAGS: ClassVar[dict[str, str]] = {
        "dir": "model-cache-dir",
        "max_bytes": "model-cache-max-bytes",
        "when_full": "model-cache-when-full",
        "fallback_to_shared": "model-cache-fallback-to-shared",
        "verify": "model-cache-verify",
    }

    dir: str | None = None
    """Node-local directory of the cache (the same path on every node; made if missing).
    The model's directory is copied there once per node and revision, before the first
    engine on that node starts; every later start there reads the copy. Unset: no cache,
    engines read ``model.path`` as given."""
    max_bytes: int | None = Field(default=None, ge=1)
    """Most bytes the cache may hold over all its entries; unset: no bound."""
    when_full: WhenFull = "evict"
    """A model that does not fit under ``max_bytes``: ``evict`` removes the entries used
    least recently (never one in use by a start in progress) until it fits; ``refuse``
    fails the staging."""
    fallback_to_shared: bool = False
    """A failed staging (disk full, a corrupted copy, an unreadable file) starts the
    engine from ``model.path`` with a warning instead of failing the start."""
    verify: CacheVerify = "sizes"
    """What a start that reuses an entry checks: ``sizes`` (every file's size, cheap) or
    ``checksums`` (re-hash the checksummed files: reads the whole copy). A fresh copy's
    files are hashed as they are read from the source (the source is read once); those
    are the checksums a later check compares against."""
