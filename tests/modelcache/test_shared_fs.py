"""Staging from a shared filesystem served over a throttled network link to named nodes
(network namespaces): real copies over the network, one read of the shared path per node,
checksums, reuse, eviction and a corrupted copy (docs/operations.md, "Model cache").

The model is a generated 256 MiB checkpoint (4 safetensors shards); the file server's
link is limited to 1 Gbit/s with ``tc``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra.model_dir import model_dir
from tests.infra.netns import Network, network
from tests.infra.shared_fs import SharedFs, shared_fs

pytestmark = pytest.mark.fast_start

MIB = 1 << 20
MODEL_BYTES = 256 * MIB
RATE_MBIT = 1000


@dataclass
class Cluster:
    net: Network
    fs: SharedFs
    work: Path

    def stage(self, node: str, model: str, *flags: str) -> subprocess.Popen[bytes]:
        """``python -m dynamoctl.modelcache`` run on ``node``, into its own cache."""
        argv = [sys.executable, "-m", "dynamoctl.modelcache", str(self.fs.mount / model)]
        argv += ["--model-cache-dir", str(self.work / node / "cache"), *flags]
        return subprocess.Popen(
            self.net.host(node).argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def staged(self, node: str, model: str, *flags: str) -> dict[str, object]:
        proc = self.stage(node, model, *flags)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        return dict(json.loads(out))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("fast-start")
    export = work / "export"
    model_dir(export / "big", MODEL_BYTES)
    model_dir(export / "small", 16 * MIB)
    with (
        network(["fileserver", "node-a", "node-b"]) as net,
        shared_fs(net.host("fileserver"), export, work / "shared", RATE_MBIT) as fs,
    ):
        yield Cluster(net, fs, work)


def test_staging_copies_over_the_network_once_per_node(cluster: Cluster) -> None:
    first = cluster.staged("node-a", "big")
    assert first["node"] == "node-a" and first["hit"] is False
    cached = Path(str(first["path"]))
    manifest = json.loads((cached.parent / "manifest.json").read_bytes())
    source = cluster.work / "export" / "big"
    for f in manifest["files"]:
        if f["path"].endswith(".safetensors"):
            digest = hashlib.sha256((source / f["path"]).read_bytes()).hexdigest()
            assert f["sha256"] == digest
    assert manifest["bytes"] >= MODEL_BYTES
    # the copy crossed the throttled link: no faster than the link allows
    assert float(str(first["staging_s"])) >= MODEL_BYTES * 8 / (RATE_MBIT * 1e6)
    again = cluster.staged("node-a", "big")
    assert again["hit"] is True and again["path"] == first["path"]
    # two starts at once on node-b: one reads the shared path, the other waits for it
    both = [cluster.stage("node-b", "big") for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in both]
    assert sorted(o["hit"] for o in outs) == [False, True]
    assert {o["node"] for o in outs} == {"node-b"}


def test_a_corrupted_copy_is_detected_and_staged_again(cluster: Cluster) -> None:
    entry = Path(str(cluster.staged("node-a", "small")["path"]))
    shard = entry / "model-00001-of-00004.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    out = cluster.staged("node-a", "small", "--model-cache-verify", "checksums")
    assert out["hit"] is False
    source = cluster.work / "export" / "small" / shard.name
    assert shard.read_bytes() == source.read_bytes()


def test_eviction_makes_room_for_the_next_model(cluster: Cluster) -> None:
    # node-b holds big; big and small together exceed the bound
    bound = ["--model-cache-max-bytes", str(MODEL_BYTES + 8 * MIB)]
    out = cluster.staged("node-b", "small", *bound)
    assert out["hit"] is False
    entries = sorted((cluster.work / "node-b" / "cache").glob("*/manifest.json"))
    sources = {json.loads(p.read_bytes())["source"].rsplit("/", 1)[-1] for p in entries}
    assert sources == {"small"}  # big, used least recently, went
