"""A model directory's files as a cache sees them: which are checksummed, its revision."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

CHECKSUMMED_SUFFIXES = (".safetensors", ".safetensors.index.json")
CHECKSUMMED_NAMES = frozenset(
    {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
)
"""Files an engine trusts without checking: a flipped byte in them is a wrong model, not an
error (the weights, their index, the configuration and the tokenizer)."""

SKIPPED_DIRS = frozenset({".git", ".cache"})
"""Not part of a model (a clone's history, a download's locks)."""


class SourceError(OSError):
    """The source directory cannot be read as a model directory."""


@dataclass(frozen=True)
class SourceFile:
    """One regular file of a model directory."""

    rel: str
    """Path relative to the directory, ``/``-separated."""
    size: int
    mtime_ns: int

    @property
    def checksummed(self) -> bool:
        name = self.rel.rsplit("/", 1)[-1]
        return name in CHECKSUMMED_NAMES or name.endswith(CHECKSUMMED_SUFFIXES)


def scan(root: Path) -> list[SourceFile]:
    """Every regular file under ``root`` (symbolic links followed, as Hugging Face snapshots
    point into their blobs), sorted by path."""
    if not root.is_dir():
        raise SourceError(f"{root} is not a directory")
    found = []
    for parent, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in names:
            path = Path(parent, name)
            rel = path.relative_to(root).as_posix()
            try:
                info = path.stat()
            except OSError as exc:
                raise SourceError(f"file {rel}: {exc.strerror or exc}") from exc
            found.append(SourceFile(rel=rel, size=info.st_size, mtime_ns=info.st_mtime_ns))
    if not found:
        raise SourceError(f"{root} holds no files")
    return sorted(found, key=lambda f: f.rel)


def revision(files: list[SourceFile]) -> str:
    """The content fingerprint of a scan: names, sizes and modification times, hashed (a
    rewritten file is a new revision; reading the bytes would cost a whole copy)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.rel}\0{f.size}\0{f.mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def entry_key(source: Path, rev: str) -> str:
    """The cache entry of ``source`` at revision ``rev``: a readable stem plus a hash."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in source.name)[:48]
    where = hashlib.sha256(f"{source}\0{rev}".encode()).hexdigest()[:16]
    return f"{stem or 'model'}-{where}"
