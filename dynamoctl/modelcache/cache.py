"""One node's model cache: entries under ``dir``, one per source and revision.

An entry is ``<key>/model/`` (the copy) and ``<key>/manifest.json``, written last: an entry
without a manifest is a copy that never finished and is removed by the next staging. One
``.lock`` file serialises staging and eviction on the node (``flock``), so two starts on
the node copy once: the second waits, then finds the entry. A start that uses an entry
holds a shared ``flock`` on its ``<key>/in-use`` for the life of its process; eviction
skips such entries. ``in-use``'s modification time is the entry's last use (LRU).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import msgspec

from dynamoctl.modelcache.copy import FileFault, Progress, check_files, copy_file
from dynamoctl.modelcache.peer import PeerError, copy_from_peer, peer_manifest
from dynamoctl.modelcache.scan import SourceFile, entry_key, revision, scan
from dynamoctl.settings.model_cache import ModelCacheSettings
from dynamoctl.wire.model_cache import CachedFile, CacheManifest

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
IN_USE = "in-use"


class StagingError(Exception):
    """A staging failed; says on which node, which file (when one) and why."""

    def __init__(self, node: str, source: str, reason: str) -> None:
        super().__init__(f"staging {source} on node {node} failed: {reason}")
        self.node, self.source, self.reason = node, source, reason


@dataclass
class Entry:
    """A complete entry, and the shared lock that keeps it from eviction while held."""

    path: Path
    manifest: CacheManifest
    hit: bool
    """It was in the cache already (nothing copied)."""
    origin: str = "shared"
    """Where the copy was read: ``shared`` (the source path), ``peer URL``, ``cache`` (a
    hit), ``sbcast`` (broadcast by Slurm, :mod:`.receive`)."""
    held: IO[bytes] | None = None

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def release(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None


class NodeCache:
    """The cache in ``settings.dir`` on this node."""

    def __init__(self, settings: ModelCacheSettings, node: str | None = None) -> None:
        if settings.dir is None:
            raise ValueError("a model cache needs a directory")
        self.root = Path(settings.dir)
        self.settings = settings
        self.node = node or socket.gethostname()

    def entries(self) -> list[tuple[Path, CacheManifest]]:
        """The complete entries, least recently used first."""
        found = []
        for manifest_file in self.root.glob(f"*/{MANIFEST}"):
            try:
                manifest = msgspec.json.decode(manifest_file.read_bytes(), type=CacheManifest)
            except (OSError, msgspec.DecodeError):
                continue
            found.append((manifest_file.parent, manifest))
        return sorted(found, key=lambda e: _last_used(e[0]))

    def stage(self, source: str | os.PathLike[str], peer: str | None = None) -> Entry:
        """The entry of ``source`` at its current revision, copied now if absent or
        damaged (from the node serving it at ``peer``, else, or if that fails, from
        ``source``); held (shared lock) until :meth:`Entry.release` or the process ends."""
        src = Path(source).absolute()
        try:
            files = scan(src)
        except OSError as exc:
            raise self.error(src, str(exc)) from exc
        key = entry_key(src, revision(files))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self.error(src, f"cannot make {self.root}: {exc.strerror}") from exc
        with self.locked():
            entry = self.reuse(self.root / key, src)
            if entry is None and peer is not None:
                entry = self._copy_from_peer(src, key, files, peer)
            if entry is None:
                entry = self._copy(src, key, files)
            entry.held = _hold(entry.path)
        return entry

    def error(self, src: Path, reason: str) -> StagingError:
        return StagingError(self.node, str(src), reason)

    @contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def reuse(self, path: Path, src: Path) -> Entry | None:
        manifest_file = path / MANIFEST
        if not manifest_file.exists():
            return None
        checksums = self.settings.verify == "checksums"
        try:
            manifest = msgspec.json.decode(manifest_file.read_bytes(), type=CacheManifest)
            check_files(path / "model", manifest.files, checksums)
        except (FileFault, msgspec.DecodeError) as exc:
            log.warning("cache entry %s is damaged (%s); copying it again", path.name, exc)
            return None
        log.info("model %s found in the cache (%s)", src, path)
        return Entry(path, manifest, hit=True, origin="cache")

    def _copy(self, src: Path, key: str, files: list[SourceFile]) -> Entry:
        path = self.root / key
        shutil.rmtree(path, ignore_errors=True)
        total = sum(f.size for f in files)
        self.make_room(total, src)
        began = time.monotonic()
        log.info("staging %s (%d files, %.2f GiB) into %s", src, len(files), total / 2**30, path)
        progress = Progress(str(src), total)
        try:
            copied = [copy_file(src, path / "model", f, progress) for f in files]
            check_files(path / "model", copied, checksums=False)
        except FileFault as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise self.error(src, str(exc)) from exc
        return self.complete(path, src, revision(files), copied, began, "shared")

    def _copy_from_peer(
        self, src: Path, key: str, files: list[SourceFile], peer: str
    ) -> Entry | None:
        """The entry copied from the node serving it at ``peer``; None (with a warning)
        when that fails, for a copy from the source instead."""
        path = self.root / key
        shutil.rmtree(path, ignore_errors=True)
        began = time.monotonic()
        try:
            theirs = peer_manifest(peer)
            if theirs.source != str(src) or theirs.revision != revision(files):
                raise PeerError(
                    f"peer {peer} holds {theirs.source} at revision {theirs.revision}; "
                    f"this node needs {src} at {revision(files)}"
                )
            self.make_room(theirs.bytes, src)
            log.info("staging %s (%.2f GiB) from peer %s", src, theirs.bytes / 2**30, peer)
            progress = Progress(f"{src} from {peer}", theirs.bytes)
            copied = copy_from_peer(peer, theirs, path / "model", progress)
        except (PeerError, FileFault) as exc:
            shutil.rmtree(path, ignore_errors=True)
            log.warning("staging from peer failed (%s); reading %s instead", exc, src)
            return None
        return self.complete(path, src, theirs.revision, copied, began, f"peer {peer}")

    def complete(
        self,
        path: Path,
        src: Path,
        rev: str,
        copied: list[CachedFile],
        began: float,
        origin: str,
    ) -> Entry:
        """Write the manifest of a finished copy: the entry is complete from then on."""
        total = sum(f.size for f in copied)
        manifest = CacheManifest(
            source=str(src),
            revision=rev,
            files=copied,
            bytes=total,
            staging_s=round(time.monotonic() - began, 3),
            node=self.node,
        )
        tmp = path / (MANIFEST + ".tmp")
        tmp.write_bytes(msgspec.json.encode(manifest))
        os.replace(tmp, path / MANIFEST)  # last: the entry is complete from here on
        log.info(
            "staged %s from %s in %.1f s (%.0f MB/s)",
            src,
            origin,
            manifest.staging_s,
            total / max(manifest.staging_s, 1e-9) / 1e6,
        )
        return Entry(path, manifest, hit=False, origin=origin)

    def make_room(self, needed: int, src: Path) -> None:
        """Remove unfinished copies, then (``evict``) the least recently used entries no
        start holds until ``needed`` more bytes fit under ``max_bytes``."""
        for partial in self.root.iterdir():
            if partial.is_dir() and not (partial / MANIFEST).exists():
                shutil.rmtree(partial, ignore_errors=True)
        bound = self.settings.max_bytes
        if bound is None:
            return
        if needed > bound:
            raise self.error(src, f"{needed} bytes exceed model.cache.max_bytes ({bound})")
        entries = self.entries()
        used = sum(m.bytes for _, m in entries)
        for path, manifest in entries:
            if used + needed <= bound:
                return
            if self.settings.when_full == "refuse":
                break
            if _in_use(path):
                continue
            log.info("evicting %s (%.2f GiB, least used)", path.name, manifest.bytes / 2**30)
            shutil.rmtree(path, ignore_errors=True)
            used -= manifest.bytes
        if used + needed > bound:
            raise self.error(
                src,
                f"the cache holds {used} bytes; {needed} more exceed model.cache.max_bytes "
                f"({bound}) and when_full is {self.settings.when_full}"
                + (" (the rest are in use)" if self.settings.when_full == "evict" else ""),
            )


def _hold(path: Path) -> IO[bytes]:
    """A shared lock on the entry's ``in-use`` file, its last use stamped now."""
    fh = open(path / IN_USE, "a+b")  # noqa: SIM115 (held open: the lock lives with it)
    fcntl.flock(fh, fcntl.LOCK_SH)
    os.utime(path / IN_USE)
    return fh


def _in_use(path: Path) -> bool:
    try:
        with open(path / IN_USE, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def _last_used(path: Path) -> float:
    try:
        return (path / IN_USE).stat().st_mtime
    except OSError:
        return 0.0
