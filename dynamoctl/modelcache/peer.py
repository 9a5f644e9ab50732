"""Node to node: a node whose cache holds a model serves that entry over HTTP, and another
node copies it from there instead of reading the shared path (docs/operations.md, "Model
cache", "Coordinated staging").

The server is Python's threading HTTP server over the entry's directory (its
``manifest.json`` and ``model/``), bound to the node's cluster address, read-only, for the
length of one coordinated staging: it runs until its standard input closes (the
coordinator holds it open over SSH or a pipe), holding the entry against eviction. The
copy checks every file's size, and the SHA-256 of the checksummed ones, against the
peer's manifest as it writes them; the peer's entry must be the source's revision.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import logging
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import msgspec

from dynamoctl.modelcache.copy import CHUNK, FileFault, Progress
from dynamoctl.wire.model_cache import CachedFile, CacheManifest

log = logging.getLogger(__name__)

TIMEOUT_S = 60.0
"""Seconds a peer may leave a request or a read unanswered before the copy fails."""


class PeerError(Exception):
    """The peer cannot serve the entry (unreachable, another revision, a bad file)."""


def peer_manifest(url: str) -> CacheManifest:
    """The manifest of the entry the peer at ``url`` serves."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/manifest.json", timeout=TIMEOUT_S) as r:
            return msgspec.json.decode(r.read(), type=CacheManifest)
    except (OSError, msgspec.DecodeError) as exc:
        raise PeerError(f"peer {url}: no manifest ({exc})") from exc


def copy_from_peer(
    url: str, manifest: CacheManifest, dst_root: Path, progress: Progress
) -> list[CachedFile]:
    """Every file of the peer's entry into ``dst_root``, each checked as it is written."""
    return [_copy_one(url, f, dst_root, progress) for f in manifest.files]


def _copy_one(url: str, f: CachedFile, dst_root: Path, progress: Progress) -> CachedFile:
    target = dst_root / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256() if f.sha256 is not None else None
    copied = 0
    address = url.rstrip("/") + "/model/" + urllib.parse.quote(f.path)
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_S) as src, open(target, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                if digest is not None:
                    digest.update(chunk)
                copied += len(chunk)
                progress.add(len(chunk))
    except urllib.error.HTTPError as exc:
        raise FileFault(f.path, f"peer {url} answered {exc.code}") from exc
    except OSError as exc:
        raise FileFault(f.path, f"from peer {url}: {exc}") from exc
    if copied != f.size:
        raise FileFault(f.path, f"peer {url} sent {copied} bytes, its manifest says {f.size}")
    if digest is not None and digest.hexdigest() != f.sha256:
        raise FileFault(f.path, f"sha256 from peer {url} differs from its manifest")
    return f


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        log.debug("peer server: " + format, *args)


def serve_entry(entry: Path, address: str, port: int) -> None:
    """Serve ``entry`` (a cache entry's directory) on ``address:port`` until standard input
    closes; prints ``serving URL`` once it listens."""
    handler = functools.partial(_Quiet, directory=str(entry))
    server = http.server.ThreadingHTTPServer((address, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="peer-server", daemon=True)
    thread.start()
    host, bound = server.server_address[:2]
    print(f"serving http://{host!s}:{bound}/", flush=True)
    try:
        while sys.stdin.buffer.read(1 << 16):
            pass
    finally:
        server.shutdown()
        server.server_close()
