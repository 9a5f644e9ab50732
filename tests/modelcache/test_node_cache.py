"""The node model cache on real files: a copy checked by checksums, reuse by revision,
LRU eviction that spares entries in use, damaged and unfinished entries, two starts on one
node copying once, errors naming node, file and reason (docs/operations.md, "Model
cache")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamoctl.engines.mocker.startup import Startup, StartupOptions
from dynamoctl.modelcache.cache import MANIFEST, NodeCache, StagingError
from dynamoctl.modelcache.stage import stage_engine_weights
from dynamoctl.settings.model_cache import ModelCacheSettings
from tests.infra.model_dir import model_dir

pytestmark = pytest.mark.fast_start

MIB = 1 << 20


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return model_dir(tmp_path / "shared" / "tiny-llama", 4 * MIB)


def cache(tmp_path: Path, **kw: object) -> NodeCache:
    return NodeCache(ModelCacheSettings(dir=str(tmp_path / "cache"), **kw), node="node-a")


def test_stage_copies_and_checksums_the_weights(tmp_path: Path, source: Path) -> None:
    entry = cache(tmp_path).stage(source)
    assert not entry.hit
    for f in entry.manifest.files:
        assert (entry.model_dir / f.path).read_bytes() == (source / f.path).read_bytes()
    sums = {f.path: f.sha256 for f in entry.manifest.files}
    shard = "model-00001-of-00004.safetensors"
    assert sums[shard] == hashlib.sha256((source / shard).read_bytes()).hexdigest()
    assert sums["model.safetensors.index.json"] is not None
    assert sums["config.json"] is not None
    assert sums["README.md"] is None  # sizes only
    assert entry.manifest.bytes == sum(p.stat().st_size for p in source.iterdir())
    assert entry.manifest.node == "node-a"


def test_a_second_start_reuses_the_entry_and_a_new_revision_does_not(
    tmp_path: Path, source: Path
) -> None:
    first = cache(tmp_path).stage(source)
    first.release()
    again = cache(tmp_path).stage(source)
    assert again.hit and again.path == first.path
    shard = source / "model-00002-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[::-1])  # same size, new content and mtime
    os.utime(shard, ns=(1, 1))
    newer = cache(tmp_path).stage(source)
    assert not newer.hit and newer.path != first.path
    assert (newer.model_dir / shard.name).read_bytes() == shard.read_bytes()


def test_least_recently_used_entry_is_evicted_but_not_one_in_use(
    tmp_path: Path, source: Path
) -> None:
    other = model_dir(tmp_path / "shared" / "other", 4 * MIB)
    third = model_dir(tmp_path / "shared" / "third", 4 * MIB)
    size = 4 * MIB + 64 * 1024
    node = cache(tmp_path, max_bytes=2 * size + 1024)
    a = node.stage(source)
    b = node.stage(other)
    os.utime(b.path / "in-use", (1, 1))  # b used longer ago than a
    a.release()
    b.release()
    node.stage(third).release()
    left = {m.source for _, m in node.entries()}
    assert left == {str(source), str(third)}
    held = node.stage(source)  # a hit, now held
    assert held.hit
    with pytest.raises(StagingError, match="in use"):
        cache(tmp_path, max_bytes=size + 1024).stage(other)
    held.release()


def test_refuse_when_full(tmp_path: Path, source: Path) -> None:
    other = model_dir(tmp_path / "shared" / "other", 4 * MIB)
    node = cache(tmp_path, max_bytes=5 * MIB, when_full="refuse")
    node.stage(source).release()
    with pytest.raises(StagingError, match="when_full is refuse"):
        node.stage(other)
    with pytest.raises(StagingError, match=r"exceed model\.cache\.max_bytes"):
        cache(tmp_path, max_bytes=MIB).stage(other)


def test_a_corrupted_copy_is_detected_and_copied_again(tmp_path: Path, source: Path) -> None:
    entry = cache(tmp_path).stage(source)
    entry.release()
    shard = entry.model_dir / "model-00003-of-00004.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert cache(tmp_path).stage(source).hit  # sizes only: not seen
    fixed = cache(tmp_path, verify="checksums").stage(source)
    assert not fixed.hit
    assert shard.read_bytes() == (source / shard.name).read_bytes()
    with open(shard, "r+b") as fh:
        fh.truncate(100)
    assert not cache(tmp_path).stage(source).hit  # a short file is seen by its size


def test_an_unfinished_copy_is_never_used(tmp_path: Path, source: Path) -> None:
    entry = cache(tmp_path).stage(source)
    entry.release()
    (entry.path / MANIFEST).unlink()  # as if the copy had been killed before its end
    again = cache(tmp_path).stage(source)
    assert not again.hit and (again.path / MANIFEST).exists()
    again.release()
    (again.path / MANIFEST).write_text('{"source": ')  # a damaged manifest
    third = cache(tmp_path).stage(source)
    assert not third.hit and (third.path / MANIFEST).exists()


def test_a_staging_error_names_node_file_and_reason(tmp_path: Path, source: Path) -> None:
    (source / "model-00004-of-00004.safetensors").unlink()
    (source / "model-00004-of-00004.safetensors").symlink_to(tmp_path / "gone")
    with pytest.raises(StagingError) as err:
        cache(tmp_path).stage(source)
    message = str(err.value)
    assert "node node-a" in message
    assert "model-00004-of-00004.safetensors" in message
    assert "No such file" in message


def test_two_starts_on_one_node_copy_once(tmp_path: Path, source: Path) -> None:
    argv = [sys.executable, "-m", "dynamoctl.modelcache", str(source)]
    argv += ["--model-cache-dir", str(tmp_path / "cache")]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(o["hit"] for o in outs) == [False, True]
    assert outs[0]["path"] == outs[1]["path"]


def test_the_engine_argument_points_at_the_copy(tmp_path: Path, source: Path) -> None:
    settings = ModelCacheSettings(dir=str(tmp_path / "cache"))
    vllm = stage_engine_weights("vllm", {"model": str(source), "block_size": 16}, settings)
    assert vllm.report is not None and vllm.report.weights_from == "cache"
    assert vllm.engine_options["model"] == vllm.report.path != str(source)
    assert Path(vllm.engine_options["model"], "config.json").exists()
    assert vllm.engine_options["tokenizer"] == str(source)  # what the frontend can read
    mocker = stage_engine_weights("mocker", {"weights_model": str(source)}, settings)
    assert mocker.engine_options["weights_model"] == vllm.report.path
    assert mocker.engine_options["weights_source"] == "local-disk"
    assert mocker.report is not None and mocker.report.hit
    none = stage_engine_weights("mocker", {"model": "m"}, settings)
    assert none.report is None and none.engine_options == {"model": "m"}


def test_fallback_to_the_shared_path_only_when_allowed(tmp_path: Path, source: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache should be")
    strict = ModelCacheSettings(dir=str(blocked))
    with pytest.raises(StagingError, match="cannot make"):
        stage_engine_weights("vllm", {"model": str(source)}, strict)
    lenient = ModelCacheSettings(dir=str(blocked), fallback_to_shared=True)
    staged = stage_engine_weights("vllm", {"model": str(source)}, lenient)
    assert staged.engine_options["model"] == str(source)
    assert staged.report is not None and staged.report.weights_from == "shared"
    assert staged.report.reason is not None and "cannot make" in staged.report.reason
    with pytest.raises(StagingError, match="not a directory on this node"):
        stage_engine_weights("vllm", {"model": "Qwen/Qwen3-0.6B"}, strict)


def test_the_mocker_reads_its_weights_at_the_bandwidth_of_where_they_are(
    tmp_path: Path, source: Path
) -> None:
    settings = ModelCacheSettings(dir=str(tmp_path / "cache"))
    staged = stage_engine_weights("mocker", {"weights_model": str(source)}, settings)
    cached = StartupOptions(
        weights_model=staged.engine_options["weights_model"],
        weights_source=staged.engine_options["weights_source"],
    )
    from_cache = Startup(cached)
    from_shared = Startup(StartupOptions(weights_model=str(source)))
    shards = sum(p.stat().st_size for p in source.glob("*.safetensors"))
    assert from_cache.bytes == from_shared.bytes == shards
    # shared-fs 1 GB/s, local-disk 3 GB/s (docs/mocker.md, "Start-up")
    assert from_shared.weights_s == pytest.approx(3 * from_cache.weights_s)
