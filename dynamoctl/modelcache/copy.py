"""Copying a model directory into a cache entry, hashing as it reads (the source is read
once), and checking an entry's files against its manifest."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from dynamoctl.modelcache.scan import SourceFile
from dynamoctl.wire.model_cache import CachedFile

CHUNK = 8 << 20
"""Bytes per read: large enough that a network filesystem streams."""
PROGRESS_EVERY_S = 5.0

log = logging.getLogger(__name__)


class FileFault(Exception):
    """One file failed (unreadable, short, changed, wrong checksum); names it and why."""

    def __init__(self, rel: str, reason: str) -> None:
        super().__init__(f"file {rel}: {reason}")
        self.rel = rel
        self.reason = reason


class Progress:
    """Logs bytes copied of the total every :data:`PROGRESS_EVERY_S` seconds."""

    def __init__(self, what: str, total: int, clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.clock = what, total, clock
        self.done = 0
        self.began = self.last = clock()

    def add(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            rate = self.done / max(now - self.began, 1e-9) / 1e6
            log.info(
                "staging %s: %.2f of %.2f GiB (%.0f%%), %.0f MB/s",
                self.what,
                self.done / (1 << 30),
                self.total / (1 << 30),
                100 * self.done / max(self.total, 1),
                rate,
            )


def copy_file(src_root: Path, dst_root: Path, f: SourceFile, progress: Progress) -> CachedFile:
    """Copy one file, hashing it when it is checksummed; the bytes read must be the size
    the scan saw (a source rewritten during the copy is refused)."""
    digest = hashlib.sha256() if f.checksummed else None
    target = dst_root / f.rel
    target.parent.mkdir(parents=True, exist_ok=True)
    copied = 0
    try:
        with open(src_root / f.rel, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                if digest is not None:
                    digest.update(chunk)
                copied += len(chunk)
                progress.add(len(chunk))
    except OSError as exc:
        raise FileFault(f.rel, exc.strerror or str(exc)) from exc
    if copied != f.size:
        raise FileFault(f.rel, f"read {copied} bytes, the source listed {f.size} (changed?)")
    return CachedFile(path=f.rel, size=f.size, sha256=digest.hexdigest() if digest else None)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_files(root: Path, files: list[CachedFile], checksums: bool) -> None:
    """Raise :class:`FileFault` for the first file under ``root`` that is missing, of
    another size, or (``checksums``) of another SHA-256 than ``files`` says."""
    for f in files:
        path = root / f.path
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise FileFault(f.path, exc.strerror or str(exc)) from exc
        if size != f.size:
            raise FileFault(f.path, f"{size} bytes, {f.size} expected")
        if checksums and f.sha256 is not None and (got := sha256_of(path)) != f.sha256:
            raise FileFault(f.path, f"sha256 {got[:12]}…, {f.sha256[:12]}… expected")
