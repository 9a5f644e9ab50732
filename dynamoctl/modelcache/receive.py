"""A model broadcast into a node's cache by someone else (Slurm's ``sbcast``): the
sender's entry arrives as flat files in the cache directory, ``.incoming.<key>.<i>`` for
the ``i``-th file of its manifest and ``.incoming.<key>.manifest`` for the manifest
itself (``sbcast`` writes files, not directories, and only where the directory exists).
Before the broadcast each node is asked whether it already holds the entry
(:func:`probe`); after it, each node checks what arrived against the sender's manifest
(sizes and SHA-256) and moves it into place as its own entry (:func:`adopt`), or drops it
when it held the entry already. docs/operations.md, "Model cache", "Slurm: sbcast".
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import msgspec

from dynamoctl.modelcache.cache import MANIFEST, Entry, NodeCache, StagingError
from dynamoctl.modelcache.copy import FileFault, check_files
from dynamoctl.modelcache.scan import entry_key, revision, scan
from dynamoctl.wire.model_cache import CacheManifest

INCOMING = ".incoming"


def incoming_name(key: str, index: int | None) -> str:
    """The flat name the ``index``-th file of entry ``key`` arrives under (None: the
    manifest)."""
    return f"{INCOMING}.{key}.{'manifest' if index is None else index}"


def source_key(cache: NodeCache, source: str) -> tuple[Path, str]:
    """``source`` made absolute and the key of its entry at its current revision."""
    src = Path(source).absolute()
    try:
        return src, entry_key(src, revision(scan(src)))
    except OSError as exc:
        raise cache.error(src, str(exc)) from exc


def probe(cache: NodeCache, source: str) -> bool:
    """Whether this node holds a complete entry of ``source`` (checked as a start would);
    makes the cache directory so that a broadcast can land in it."""
    src, key = source_key(cache, source)
    try:
        cache.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cache.error(src, f"cannot make {cache.root}: {exc.strerror}") from exc
    with cache.locked():
        return cache.reuse(cache.root / key, src) is not None


def adopt(cache: NodeCache, source: str) -> Entry:
    """The entry of ``source``: the one this node held already (the broadcast files are
    dropped), else the broadcast files, checked against the sender's manifest (every
    size, every SHA-256 it lists) and moved into place. A missing or damaged file is a
    :class:`StagingError` naming it; nothing half-adopted is left."""
    src, key = source_key(cache, source)
    began = time.monotonic()
    arrived = sorted(cache.root.glob(incoming_name(key, None).removesuffix("manifest") + "*"))
    try:
        with cache.locked():
            held = cache.reuse(cache.root / key, src)
            if held is not None:
                return held
            return _move_in(cache, src, key, began)
    finally:
        for path in arrived:
            path.unlink(missing_ok=True)


def _move_in(cache: NodeCache, src: Path, key: str, began: float) -> Entry:
    try:
        raw = (cache.root / incoming_name(key, None)).read_bytes()
        theirs = msgspec.json.decode(raw, type=CacheManifest)
    except (OSError, msgspec.DecodeError) as exc:
        raise cache.error(src, f"no usable broadcast manifest for entry {key}: {exc}") from exc
    current = revision(scan(src))
    if theirs.source != str(src) or theirs.revision != current:
        raise cache.error(
            src,
            f"the broadcast holds {theirs.source} at revision {theirs.revision}; "
            f"this node sees {src} at {current}",
        )
    path = cache.root / key
    shutil.rmtree(path, ignore_errors=True)
    cache.make_room(theirs.bytes, src)
    model = path / "model"
    try:
        for index, f in enumerate(theirs.files):
            target = model / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(cache.root / incoming_name(key, index), target)
        check_files(model, theirs.files, checksums=True)
    except (OSError, FileFault) as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise StagingError(cache.node, str(src), f"broadcast copy: {exc}") from exc
    return cache.complete(path, src, theirs.revision, theirs.files, began, "sbcast")


def broadcast_files(entry: Entry) -> list[tuple[Path, str]]:
    """What a sender broadcasts of its ``entry``: (its file, the name it arrives under in
    the receivers' cache directory), the manifest last (a receiver adopts nothing
    without it)."""
    key = entry.path.name
    files = [
        (entry.model_dir / f.path, incoming_name(key, index))
        for index, f in enumerate(entry.manifest.files)
    ]
    return [*files, (entry.path / MANIFEST, incoming_name(key, None))]
