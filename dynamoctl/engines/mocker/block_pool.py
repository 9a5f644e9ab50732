"""A paged KV block pool with reference counts and a prefix cache, like vLLM's.

Blocks are ids ``0..num_blocks-1``. A request holds blocks (``ref > 0``); a full block is
*registered* under its sequence hash and stays a cache hit after its holders release it,
until the pool needs the block back. Free blocks are reused least recently freed first;
never-used blocks go before any freed one, and a request releases its blocks tail first,
so the deepest blocks of a prefix are evicted before its root.

The cache maps each hash to exactly one block: a block that fills with a hash already
cached (two identical prompts computed in the same step) is not registered, so it is a
plain block to the pool and invisible to subscribers. Hence the event contract:
``BlockStored`` when a hash enters the cache, ``BlockRemoved`` when it leaves (eviction),
``AllBlocksCleared`` on reset. Applying the events in order reproduces
:meth:`BlockPool.cached_hashes` exactly.

Per-block state grows as blocks are first used, so an idle pool of 16k blocks costs
almost nothing: a hundred mocker engines fit in one process.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from dynamoctl.wire.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
)


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens; records KV events until taken."""

    def __init__(self, num_blocks: int, block_size: int, *, medium: str = MEDIUM_GPU) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.medium = medium
        # Indexed by block id, for the ids handed out so far (``len`` = ids ever used).
        self._ref: list[int] = []
        self._hash: list[int | None] = []
        # Used blocks nobody holds, least recently freed first (cached or not).
        self._free: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[int, int] = {}  # sequence hash -> block id
        self._num_active = 0
        self._events: list[KVEvent] = []
        self.listener: Callable[[KVEvent], None] | None = None
        """Called with each event as it is recorded (the KV tiers follow the pool)."""

    # ------------------------------------------------------------------ state

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take (never used, or cached/free but not held)."""
        return self.num_blocks - len(self._ref) + len(self._free)

    @property
    def num_active(self) -> int:
        """Blocks held by at least one request."""
        return self._num_active

    @property
    def num_cached(self) -> int:
        """Hashes in the prefix cache (held or not)."""
        return len(self._cached)

    def cached_hashes(self) -> set[int]:
        """Sequence hashes currently in the prefix cache."""
        return set(self._cached)

    def ref_count(self, block: int) -> int:
        return self._ref[block] if block < len(self._ref) else 0

    def block_hash(self, block: int) -> int | None:
        """The hash ``block`` is cached under, None if it is not registered."""
        return self._hash[block] if block < len(self._hash) else None

    def check(self, holds: Mapping[int, int]) -> None:
        """Assert the bookkeeping matches ``holds`` (block -> holders); tests, debugging."""
        for block, ref in enumerate(self._ref):
            assert ref == holds.get(block, 0), f"block {block}: ref {ref}, held {holds.get(block)}"
            assert (ref == 0) == (block in self._free), f"block {block}: ref {ref} vs free list"
        assert set(holds) <= set(range(len(self._ref))), "holds a block never handed out"
        assert self._num_active == len(holds), "active count"
        for h, block in self._cached.items():
            assert self._hash[block] == h, f"cache entry {h} -> block {block}"
        assert sum(h is not None for h in self._hash) == len(self._cached), "stray hashes"

    # ------------------------------------------------------------------ prefix cache

    def match_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks caching the longest prefix of ``hashes`` (at most ``max_blocks``)."""
        out: list[int] = []
        cached = self._cached
        for h in hashes[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def num_unheld(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cache hits) sit in the free list: holding them costs
        free blocks just like allocating."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    def store(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        parent: int | None,
        token_ids: Sequence[int],
        adapter: str | None = None,
    ) -> None:
        """Register newly full ``blocks`` (a chain following ``parent``) under ``hashes``.

        ``token_ids`` are the blocks' tokens, ``block_size`` each; ``adapter``: the LoRA
        adapter they were computed under (named in the events, as vLLM's ``lora_name``).
        Records one ``BlockStored`` per run of hashes new to the cache.
        """
        run_start = -1
        for i, (block, h) in enumerate(zip(blocks, hashes, strict=True)):
            if h in self._cached:
                if run_start >= 0:
                    self._stored(hashes, run_start, i, parent, token_ids, adapter)
                    run_start = -1
                continue
            self._hash[block] = h
            self._cached[h] = block
            if run_start < 0:
                run_start = i
        if run_start >= 0:
            self._stored(hashes, run_start, len(hashes), parent, token_ids, adapter)

    def _stored(
        self,
        hashes: Sequence[int],
        start: int,
        end: int,
        parent: int | None,
        token_ids: Sequence[int],
        adapter: str | None,
    ) -> None:
        bs = self.block_size
        self._record(
            BlockStored(
                block_hashes=list(hashes[start:end]),
                parent_block_hash=hashes[start - 1] if start else parent,
                token_ids=list(token_ids[start * bs : end * bs]),
                block_size=bs,
                medium=self.medium,
                lora_name=adapter,
            )
        )

    # ------------------------------------------------------------------ holding blocks

    def acquire(self, blocks: Sequence[int]) -> None:
        """Hold cached ``blocks`` (prefix hits) once more each."""
        ref, free = self._ref, self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
                self._num_active += 1
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks held once each, evicting least recently freed cached blocks.

        Callers check :attr:`num_free` first; asking for more is a bug (``RuntimeError``).
        """
        if n > self.num_free:
            raise RuntimeError(f"allocate({n}) with {self.num_free} free blocks")
        out: list[int] = []
        evicted: list[ExternalBlockHash] = []
        ref, hashes, free = self._ref, self._hash, self._free
        fresh = min(n, self.num_blocks - len(ref))
        if fresh:
            first = len(ref)
            ref.extend([1] * fresh)
            hashes.extend([None] * fresh)
            out.extend(range(first, first + fresh))
        for _ in range(n - fresh):
            block, _ = free.popitem(last=False)
            h = hashes[block]
            if h is not None:
                del self._cached[h]
                hashes[block] = None
                evicted.append(h)
            ref[block] = 1
            out.append(block)
        self._num_active += n
        if evicted:
            self._record(BlockRemoved(block_hashes=evicted, medium=self.medium))
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one hold on each of a request's ``blocks`` (given in sequence order)."""
        ref, free = self._ref, self._free
        for b in reversed(blocks):  # tail first: it is evicted before the prefix
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                self._num_active -= 1

    def reset(self) -> bool:
        """Drop the whole prefix cache; False (and nothing done) while any block is held."""
        if self._num_active:
            return False
        for block in self._cached.values():
            self._hash[block] = None
        self._cached.clear()
        self._record(AllBlocksCleared())
        return True

    def add_event(self, event: KVEvent) -> None:
        """Record an event of a tier below this pool, in order with the pool's own."""
        self._events.append(event)

    def _record(self, event: KVEvent) -> None:
        self._events.append(event)
        if self.listener is not None:
            self.listener(event)

    def take_events(self) -> list[KVEvent]:
        """Events recorded since the last call, in order."""
        events, self._events = self._events, []
        return events
