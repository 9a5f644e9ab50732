"""The KV index against a brute-force model, and its rules for awkward event streams."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.router.approx import ApproxIndex
from dynamoctl.router.index import KvIndex, PrefixIndex
from dynamoctl.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)

B = 4
WORKERS = ["w0", "w1", "w2", "w3", "w4", "w5"]


def block_tokens(content: int) -> list[int]:
    return [content * 10 + i for i in range(B)]


def tokens_of(path: tuple[int, ...]) -> list[int]:
    return [t for c in path for t in block_tokens(c)]


def engine_hash(worker: str, path: tuple[int, ...], lora: str | None = None) -> ExternalBlockHash:
    """An engine's name for the last block of ``path``: differs per engine kind (w0/w1
    share one hashing, w2 another, w3 sends bytes, w4 reuses w0's, w5 sends our own, as
    the mocker does), and as vLLM's does, per adapter (an adapter's block never shares a
    base-model block's name)."""
    if worker == "w5":
        return ref_chain(tokens_of(path), None if lora is None else lora_parent(lora))[-1]
    kind = {"w0": 0, "w1": 0, "w2": 2, "w3": 3, "w4": 0}[worker]
    h = xxhash.xxh64_intdigest(repr((kind, path) if lora is None else (kind, path, lora)).encode())
    return h.to_bytes(8, "big") if kind == 3 else h


# ----------------------------------------------------------------------- reference


def ref_chain(tokens: list[int], parent: int | None) -> list[int]:
    """Our hashes, from docs/router.md's formula, independently of dynamoctl.kv.hashing."""
    out, prev = [], parent
    for i in range(len(tokens) // B):
        local = xxhash.xxh3_64_intdigest(struct.pack(f"<{B}I", *tokens[i * B : (i + 1) * B]), 1337)
        prev = (
            local
            if prev is None
            else xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, local), 1337)
        )
        out.append(prev)
    return out


@dataclass
class Reference:
    """Per worker: engine hash -> [our hash, outstanding GPU stores, outstanding host
    stores]. An identity is known while any tier holds the block (a GPU block may chain
    from a parent only offloaded); only GPU blocks are matched and counted."""

    workers: dict[str, dict[ExternalBlockHash, list[int]]] = field(default_factory=dict)

    def apply(self, worker: str, event: KVEvent) -> None:
        blocks = self.workers.get(worker)
        if blocks is None:
            return
        if isinstance(event, BlockStored):
            if event.block_size != B:
                return
            slot = 2 if event.medium == "CPU" else 1
            parent = None if event.lora_name is None else lora_parent(event.lora_name)
            if event.parent_block_hash is not None:
                if event.parent_block_hash not in blocks:
                    return
                parent = blocks[event.parent_block_hash][0]
            ours = ref_chain(event.token_ids, parent)
            for e, o in zip(event.block_hashes, ours, strict=False):
                blocks.setdefault(e, [o, 0, 0])[slot] += 1
        elif isinstance(event, BlockRemoved):
            slot = 2 if event.medium == "CPU" else 1
            for e in event.block_hashes:
                if e in blocks and blocks[e][slot]:
                    blocks[e][slot] -= 1
                    if not (blocks[e][1] or blocks[e][2]):
                        del blocks[e]
        else:
            blocks.clear()

    def gpu(self, worker: str) -> set[int]:
        return {o for o, n, _ in self.workers[worker].values() if n}

    def find_matches(self, hashes: list[int]) -> dict[str, int]:
        out = {}
        for worker in self.workers:
            held = self.gpu(worker)
            n = 0
            while n < len(hashes) and hashes[n] in held:
                n += 1
            if n:
                out[worker] = n
        return out


# ----------------------------------------------------------------------- operations

paths = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple)
short_paths = st.lists(st.integers(0, 1), min_size=1, max_size=2).map(tuple)  # often hit
workers = st.sampled_from(WORKERS)


@st.composite
def stores(draw: st.DrawFn) -> tuple[str, KVEvent]:
    worker, path = draw(workers), draw(st.one_of(short_paths, paths))
    start = draw(st.integers(0, len(path) - 1))
    end = draw(st.integers(start + 1, len(path)))
    variant = draw(st.sampled_from(["gpu", "gpu", "gpu", "none", "cpu", "lora", "bs"]))
    lora = "adapter" if variant == "lora" else None
    parent = engine_hash(worker, path[:start], lora) if start else None
    if draw(st.integers(0, 9)) == 0:
        parent = draw(st.integers(0, 2**64 - 1))  # a parent nobody stored
    short = draw(st.integers(0, 9)) == 0  # token ids short of the last block
    tokens = tokens_of(path[start:end])[: -1 if short else None]
    return worker, BlockStored(
        block_hashes=[engine_hash(worker, path[: i + 1], lora) for i in range(start, end)],
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=8 if variant == "bs" else B,
        medium={"gpu": "GPU", "cpu": "CPU"}.get(variant),
        lora_name=lora,
    )


@st.composite
def removes(draw: st.DrawFn) -> tuple[str, KVEvent]:
    worker = draw(workers)
    chosen = draw(st.lists(st.one_of(short_paths, paths), min_size=1, max_size=3))
    hashes = [engine_hash(worker, p) for p in chosen] * draw(st.integers(1, 2))
    if draw(st.booleans()):
        hashes.append(draw(st.integers(0, 2**64 - 1)))  # unknown
    return worker, BlockRemoved(hashes, medium=draw(st.sampled_from(["GPU", None, "CPU"])))


def undo(op: tuple[str, KVEvent]) -> tuple[str, KVEvent]:
    worker, event = op
    assert isinstance(event, BlockStored)
    return worker, BlockRemoved(event.block_hashes, medium=event.medium)


operations = st.one_of(
    stores().map(lambda op: [op]),
    # The same hashes stored twice (two vLLM blocks), then removed once or twice.
    st.tuples(stores(), st.integers(0, 2)).map(lambda t: [t[0], t[0]] + [undo(t[0])] * t[1]),
    removes().map(lambda op: [op]),
    removes().map(lambda op: [op]),
    st.tuples(workers, st.just(AllBlocksCleared())).map(lambda op: [op]),
    st.tuples(workers, st.sampled_from(["remove_worker", "add_worker"])).map(lambda op: [op]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operations, max_size=40).map(lambda runs: [op for run in runs for op in run]))
def test_find_matches_equals_brute_force(ops: list[tuple[str, KVEvent | str]]) -> None:
    index, ref = KvIndex(B), Reference()
    for w in WORKERS:
        index.add_worker(w)
        ref.workers[w] = {}
    for worker, op in ops:
        if op == "remove_worker":
            index.remove_worker(worker)
            ref.workers.pop(worker, None)
        elif op == "add_worker":
            index.add_worker(worker)
            ref.workers.setdefault(worker, {})
        else:
            assert not isinstance(op, str)
            # Batches of one, so each event also crosses the batch API.
            index.apply_batch(worker, KVEventBatch(0.0, [op]))
            ref.apply(worker, op)
    index.check()
    for path in {(a, b, c) for a in range(3) for b in range(3) for c in range(3)}:
        hashes = ref_chain(tokens_of(path), None)
        assert hashes == sequence_hashes(tokens_of(path), B)
        for depth in (1, 3):
            assert index.find_matches(hashes[:depth]) == ref.find_matches(hashes[:depth])
    for worker in index.workers():
        assert index.tree_size(worker) == len(ref.gpu(worker))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.sets(st.integers(0, 59), max_size=20)),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 60),
)
def test_find_matches_is_each_workers_contiguous_depth(
    held: list[tuple[int, set[int]]], n: int
) -> None:
    """Workers holding a run of a 60-block chain from block 0 and more blocks past it
    (gaps, none, all): each one's match is the length of its run within the first ``n``
    blocks, workers with none left out."""
    chain = list(range(1000, 1060))
    index = PrefixIndex()
    expect = {}
    for w, (run, more) in enumerate(held):
        blocks = set(range(run)) | more
        index.add_worker(f"w{w}")
        index.add(f"w{w}", [chain[b] for b in blocks])
        depth = next((d for d in range(n) if d not in blocks), n)
        if depth:
            expect[f"w{w}"] = depth
    assert index.find_matches(chain[:n]) == expect


# ----------------------------------------------------------------------- rules by example


def stored(path: tuple[int, ...], start: int = 0, worker: str = "w0") -> BlockStored:
    return BlockStored(
        block_hashes=[engine_hash(worker, path[: i + 1]) for i in range(start, len(path))],
        parent_block_hash=engine_hash(worker, path[:start]) if start else None,
        token_ids=tokens_of(path[start:]),
        block_size=B,
    )


def lora_parent(name: str) -> int:
    """An adapter's chain starts from its name's hash (docs/api.md, "LoRA adapters")."""
    return xxhash.xxh3_64_intdigest(b"lora\0" + name.encode(), 1337)


def ours(path: tuple[int, ...]) -> list[int]:
    return sequence_hashes(tokens_of(path), B)


def test_chained_stores_and_removes_by_engine_hash() -> None:
    index = KvIndex(B)
    index.add_worker("w0")
    index.apply("w0", stored((1, 2)))
    index.apply("w0", stored((1, 2, 0), start=2))  # continues from the parent's our-hash
    assert index.find_matches(ours((1, 2, 0, 1))) == {"w0": 3}
    index.apply("w0", BlockRemoved([engine_hash("w0", (1, 2))]))
    assert index.find_matches(ours((1, 2, 0))) == {"w0": 1}  # contiguous from block 0
    assert index.tree_size("w0") == 2


def test_orphan_stores_are_dropped_not_rechained() -> None:
    index = KvIndex(B)
    index.add_worker("w0")
    index.apply("w0", stored((1, 2, 0), start=1))  # parent (1,) never seen
    assert index.tree_size("w0") == 0 and index.dropped_orphans == 2
    # Hashing the orphans as a fresh chain would claim this prompt: it must not match.
    assert index.find_matches(ours((2, 0))) == {}


def test_duplicate_store_needs_as_many_removes() -> None:
    index = KvIndex(B)
    index.add_worker("w0")
    index.apply("w0", stored((1,)))
    index.apply("w0", stored((1,)))  # vLLM: one hash cached in two blocks
    index.apply("w0", BlockRemoved([engine_hash("w0", (1,))]))
    assert index.find_matches(ours((1,))) == {"w0": 1}
    index.apply("w0", BlockRemoved([engine_hash("w0", (1,)), 12345]))
    assert index.find_matches(ours((1,))) == {}
    index.check()


def test_clear_and_remove_worker_free_everything() -> None:
    index = KvIndex(B)
    for w in ("a", "b"):
        index.add_worker(w)
        index.apply(w, stored((1, 2), worker="w0"))
    index.apply("a", AllBlocksCleared())
    assert index.find_matches(ours((1, 2))) == {"b": 2}
    index.remove_worker("b")
    index.add_worker("c")  # reuses b's slot: must not inherit its blocks
    assert index.find_matches(ours((1, 2))) == {}
    index.apply("b", stored((1,)))  # events of a removed worker are ignored
    assert index.find_matches(ours((1,))) == {}
    index.check()


def test_approx_index_expires_after_ttl() -> None:
    now = [0.0]
    index = ApproxIndex(10.0, lambda: now[0])
    index.add_worker("w")
    index.record("w", ours((1, 2)))
    now[0] = 6.0
    index.record("w", ours((1,)))  # refreshes block 0 only
    now[0] = 12.0
    index.expire()
    assert index.find_matches(ours((1, 2))) == {"w": 1}
    now[0] = 17.0
    index.expire()
    assert index.find_matches(ours((1, 2))) == {}
    index.check()


def test_find_matches_with_128_workers() -> None:
    """A 4k-token prompt (256 blocks of 16) against 128 workers x 2,000 blocks each: every
    worker's match is the run of the prompt it was given (its other blocks match nothing).
    How fast: benchmarks/router.py, not a timed assertion here."""
    rng = random.Random(0)
    index = PrefixIndex()
    prompt = sequence_hashes([rng.randrange(32000) for _ in range(4096)], 16)
    expect = {}
    for w in range(128):
        run = rng.randrange(257)
        index.add_worker(f"w{w}")
        index.add(f"w{w}", prompt[:run])
        index.add(f"w{w}", [rng.getrandbits(64) for _ in range(2000)])
        if run:
            expect[f"w{w}"] = run
    assert len(expect) > 100
    assert index.find_matches(prompt) == expect


def test_an_engine_naming_blocks_by_our_hashes_is_not_hashed_again() -> None:
    """The mocker's names are ours: after block 0 checks out, the rest are taken as sent
    (the brute-force test above covers the same rules for such a worker, w5)."""
    index = KvIndex(B)
    for w in ("w0", "w5"):
        index.add_worker(w)
        index.apply(w, stored((1, 2, 0), worker=w))
        index.apply(w, stored((1, 2, 0, 2), start=3, worker=w))
    assert index.trusted_blocks == 4  # w5's, none of w0's
    assert index.find_matches(ours((1, 2, 0, 2))) == {"w0": 4, "w5": 4}
    index.apply("w5", BlockRemoved([engine_hash("w5", (1, 2))]))
    assert index.find_matches(ours((1, 2, 0, 2))) == {"w0": 4, "w5": 1}
    # Tokens short of the last block: that block is not taken on the engine's word.
    short = stored((2, 1), worker="w5")
    index.apply("w5", BlockStored(short.block_hashes, None, short.token_ids[:-1], B))
    assert index.find_matches(ours((2, 1))) == {"w5": 1}
