"""A model broadcast into a node's cache (what Slurm's ``sbcast`` leaves: flat files in the
cache directory), checked and adopted as the node's own entry; a node that held it drops
what arrived; a damaged file is refused naming it (docs/operations.md, "Slurm: sbcast").
The broadcast itself is a plain copy here; tests/slurm/test_sbcast_staging.py runs sbcast."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dynamoctl.modelcache.cache import NodeCache, StagingError
from dynamoctl.modelcache.receive import INCOMING, adopt, broadcast_files, probe
from dynamoctl.settings.model_cache import ModelCacheSettings
from tests.infra.model_dir import model_dir

pytestmark = pytest.mark.fast_start

SHARD = "model-00002-of-00004.safetensors"


def node(tmp_path: Path, name: str) -> NodeCache:
    return NodeCache(ModelCacheSettings(dir=str(tmp_path / name)), node=name)


def broadcast(sender: NodeCache, source: Path, receiver: NodeCache) -> None:
    entry = sender.stage(source)
    for local, name in broadcast_files(entry):
        shutil.copyfile(local, receiver.root / name)
    entry.release()


def test_a_broadcast_entry_is_checked_and_becomes_the_nodes_own(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 2 << 20)
    sender, receiver = node(tmp_path, "node-a"), node(tmp_path, "node-b")
    assert probe(receiver, str(source)) is False  # and the directory is there to land in
    broadcast(sender, source, receiver)
    entry = adopt(receiver, str(source))
    assert (entry.hit, entry.origin) == (False, "sbcast")
    assert entry.manifest.node == "node-b"
    want = hashlib.sha256((source / SHARD).read_bytes()).hexdigest()
    assert hashlib.sha256((entry.model_dir / SHARD).read_bytes()).hexdigest() == want
    assert not list(receiver.root.glob(f"{INCOMING}.*"))
    entry.release()
    assert probe(receiver, str(source)) is True
    again = receiver.stage(source)  # what a worker's start then finds
    assert again.hit and again.path == entry.path


def test_a_node_that_held_the_entry_drops_the_broadcast(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 1 << 20)
    sender, receiver = node(tmp_path, "node-a"), node(tmp_path, "node-b")
    receiver.stage(source).release()
    broadcast(sender, source, receiver)
    entry = adopt(receiver, str(source))
    assert entry.hit and entry.origin == "cache"
    assert not list(receiver.root.glob(f"{INCOMING}.*"))


def test_a_damaged_broadcast_file_is_refused_naming_it(tmp_path: Path) -> None:
    source = model_dir(tmp_path / "shared" / "m", 1 << 20)
    sender, receiver = node(tmp_path, "node-a"), node(tmp_path, "node-b")
    probe(receiver, str(source))
    broadcast(sender, source, receiver)
    [damaged] = [
        receiver.root / name
        for local, name in broadcast_files(sender.stage(source))
        if local.name == SHARD
    ]
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit: same size, another checksum
    damaged.write_bytes(bytes(raw))
    with pytest.raises(StagingError) as caught:
        adopt(receiver, str(source))
    assert caught.value.node == "node-b"
    assert f"file {SHARD}: sha256" in caught.value.reason
    assert not list(receiver.root.glob(f"{INCOMING}.*"))
    assert receiver.entries() == []  # nothing half-adopted
    assert probe(receiver, str(source)) is False
