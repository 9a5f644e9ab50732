"""Which worker caches which prefix: our chained block hashes → the workers holding them.

A sequence hash (:mod:`dynamoctl.kv.hashing`) names a block *and the whole prefix before
it*, so a flat map ``sequence hash → workers`` is a radix tree flattened: the path to a
node is implied by its key. :meth:`PrefixIndex.find_matches` walks a request's hashes
from block 0 and intersects the holders as it goes; a worker's overlap is the depth at
which it drops out (blocks cached contiguously from block 0). Holders are a bitmask over
worker slots, so one step of the walk is one dict lookup and one integer AND whatever
the number of workers, both in C (a 4k-token prompt against 128 workers: ~0.1 ms; see
docs/router.md).

:class:`KvIndex` feeds it from KV events. Engines name blocks with their own hashes
(vLLM's differ from ours), so it recomputes ours from each ``BlockStored``'s token ids,
chained from the parent's hash in ours, and keeps per worker the map engine hash → our
hash that ``BlockRemoved`` (engine hashes only) needs. An engine whose names are ours
(the mocker) is taken at its word once an event's first block checks out. Rules, each
chosen so that the index can be incomplete but never claims a block that is not there:

* A ``BlockStored`` whose parent is unknown to us (stored before we subscribed, removed,
  or dropped itself) is **dropped**: the true hash of a block deep in a sequence depends
  on every token before it, which we do not have, and starting a fresh chain would
  claim the blocks as the *start* of a sequence (a false hit). Its descendants are
  dropped the same way. A resync (snapshot or replay from 0) makes them reachable.
* Stores are **counted** per engine hash and removes uncount: vLLM may cache one hash in
  two blocks and then emits a ``BlockStored`` and a ``BlockRemoved`` per block, so the
  hash stays cached until the last copy goes. A remove of an unknown hash is ignored; a
  re-store under a different parent or content keeps the first identity.
* Only base-model blocks count: blocks of a LoRA adapter are not a hit for base-model
  prompts.
* Each tier (the event's ``medium``: GPU, host ``CPU``, disk ``STORAGE``;
  :mod:`dynamoctl.kv.tiers`) is counted apart: an offload tier reports its own
  stores/removes for the same engine hash, which must not cancel the GPU copy's. The GPU
  tier is this index; :attr:`KvIndex.lower` holds the others, and
  :meth:`KvIndex.find_tier_matches` walks them together (docs/router.md, "Tiers"). An
  unknown medium is ignored. A store without tokens (vLLM's offload connector without
  self-describing events) is taken when every block is already known by engine hash.
* A tier whose evictions are never published (LMCache's CPU tier,
  :meth:`KvIndex.set_silent_tier`) is aged out by an LRU estimate: past its capacity in
  blocks, the least recently stored blocks are forgotten.
* Events with a block size other than the router's are ignored (logged once per worker):
  their hashes can never match a prompt hashed with ours.
"""

from __future__ import annotations

import heapq
import logging
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_, neg
from typing import cast

from dynamoctl.kv.hashing import adapter_parent, sequence_hashes
from dynamoctl.kv.tiers import Tier, tier_of
from dynamoctl.wire.kv_events import (
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)

log = logging.getLogger(__name__)

Entry = tuple[int, int, int, int]
"""An engine hash's entry: our hash, then its stores not yet removed in each tier."""


def _counted(entry: Entry, tier: Tier, by: int) -> Entry:
    """``entry`` with ``tier``'s count moved ``by``."""
    ours, gpu, host, disk = entry
    if tier is Tier.GPU:
        return ours, gpu + by, host, disk
    if tier is Tier.HOST:
        return ours, gpu, host + by, disk
    return ours, gpu, host, disk + by


class PrefixIndex:
    """Sequence hash → set of workers (a bitmask over worker slots), reference counted per
    worker: a hash added twice to one worker needs two discards to leave it."""

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}  # sequence hash -> bitmask of slots holding it
        self._slot: dict[str, int] = {}  # worker -> its bit
        self._owner: list[str | None] = []  # bit -> worker
        self._free: list[int] = []  # released bits, reused lowest first (short masks)
        self._blocks: dict[str, dict[int, int]] = {}  # worker -> hash -> reference count

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker: str) -> None:
        """Give ``worker`` a slot (no-op if it has one)."""
        if worker in self._slot:
            return
        if self._free:
            bit = heapq.heappop(self._free)
            self._owner[bit] = worker
        else:
            bit = len(self._owner)
            self._owner.append(worker)
        self._slot[worker] = bit
        self._blocks[worker] = {}

    def remove_worker(self, worker: str) -> None:
        """Forget ``worker`` and everything it holds; its slot is reused."""
        if worker not in self._slot:
            return
        self.clear_worker(worker)
        bit = self._slot.pop(worker)
        del self._blocks[worker]
        self._owner[bit] = None
        heapq.heappush(self._free, bit)

    def clear_worker(self, worker: str) -> None:
        """Drop every block of ``worker`` (it stays known)."""
        blocks = self._blocks.get(worker)
        if not blocks:
            return
        keep = ~(1 << self._slot[worker])
        holders = self._holders
        for h in blocks:
            mask = holders[h] & keep
            if mask:
                holders[h] = mask
            else:
                del holders[h]
        blocks.clear()

    def workers(self) -> list[str]:
        return list(self._slot)

    def __contains__(self, worker: object) -> bool:
        return worker in self._slot

    # ------------------------------------------------------------------ blocks

    def add(self, worker: str, hashes: Iterable[int]) -> None:
        """Count ``hashes`` once more on ``worker`` (which must have a slot)."""
        blocks, bit = self._blocks[worker], 1 << self._slot[worker]
        holders = self._holders
        for h in hashes:
            n = blocks.get(h, 0)
            blocks[h] = n + 1
            if not n:
                holders[h] = holders.get(h, 0) | bit

    def discard(self, worker: str, hashes: Iterable[int]) -> None:
        """Count ``hashes`` once less on ``worker``; unknown ones are ignored."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        keep = ~(1 << self._slot[worker])
        holders = self._holders
        for h in hashes:
            n = blocks.get(h, 0)
            if n > 1:
                blocks[h] = n - 1
            elif n == 1:
                del blocks[h]
                mask = holders[h] & keep
                if mask:
                    holders[h] = mask
                else:
                    del holders[h]

    def tree_size(self, worker: str) -> int:
        """Distinct blocks held by ``worker`` (0 for an unknown worker)."""
        blocks = self._blocks.get(worker)
        return len(blocks) if blocks is not None else 0

    def tree_sizes(self, workers: Iterable[str]) -> list[int]:
        """:meth:`tree_size` of each of ``workers`` (known ones), in one pass."""
        blocks = self._blocks
        return [len(blocks[w]) for w in workers]

    def holders(self, block: int) -> set[str]:
        """Workers holding ``block``."""
        return set(self._bits(self._holders.get(block, 0)))

    def find_matches(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` it holds (contiguous from
        block 0); workers with none are left out."""
        # The running AND of the holders' masks, in C (map, accumulate, takewhile) up to
        # the first block nobody holds: a 32k-token prompt is 2000 blocks, and a Python
        # loop over them cost ~0.2 us each. A mask only loses bits, so the list is
        # non-increasing and each worker's depth is found by bisection.
        live = list(takewhile(bool, accumulate(map(self._holders.get, hashes, repeat(0)), and_)))
        out: dict[str, int] = {}
        depth, n = 0, len(live)
        while depth < n:
            mask = live[depth]
            end = bisect_right(live, -mask, depth, n, key=neg)
            for worker in self._bits(mask & ~(live[end] if end < n else 0)):
                out[worker] = end
            depth = end
        return out

    def _bits(self, mask: int) -> Iterable[str]:
        owner = self._owner
        while mask:
            low = mask & -mask
            name = owner[low.bit_length() - 1]
            assert name is not None
            yield name
            mask ^= low

    def check(self) -> None:
        """Assert the bitmasks agree with the per-worker counts (tests, debugging)."""
        expect: dict[int, int] = {}
        for worker, blocks in self._blocks.items():
            bit = 1 << self._slot[worker]
            for h, n in blocks.items():
                assert n > 0, f"{worker}: count {n} for {h}"
                expect[h] = expect.get(h, 0) | bit
        assert expect == self._holders, "holder masks diverge from per-worker blocks"


class KvIndex(PrefixIndex):
    """A :class:`PrefixIndex` of GPU blocks maintained from each worker's KV event stream,
    with one more per offload tier (host memory, disk) for tier-aware routing."""

    def __init__(self, block_size: int) -> None:
        super().__init__()
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        """Tokens per block; events of another size are ignored."""
        self.lower: dict[Tier, PrefixIndex] = {Tier.HOST: PrefixIndex(), Tier.DISK: PrefixIndex()}
        """Blocks per worker in each offload tier (the GPU tier is this index itself)."""
        # worker -> engine hash -> (our hash, stores not yet removed per tier: GPU, host,
        # disk). Tuples of ints, not lists: the garbage collector stops tracking them, so
        # a mirror of millions of blocks adds nothing to its full collections' pauses.
        self._engine: dict[str, dict[ExternalBlockHash, Entry]] = {}
        # Tiers whose evictions a worker does not publish (LMCache): capacity and LRU order.
        self._silent: dict[tuple[str, Tier], tuple[int, OrderedDict[ExternalBlockHash, None]]] = {}
        self._warned: set[str] = set()
        self.dropped_orphans = 0
        """Stored blocks dropped because their parent was unknown (see module doc)."""
        self.aged_out = 0
        """Blocks of silent tiers forgotten because the tier could no longer hold them."""
        self.trusted_blocks = 0
        """Stored blocks taken under the engine's hash, which was ours (the mocker's)."""

    def _tier_index(self, tier: Tier) -> PrefixIndex:
        return self if tier is Tier.GPU else self.lower[tier]

    def add_worker(self, worker: str) -> None:
        super().add_worker(worker)
        for index in self.lower.values():
            index.add_worker(worker)
        self._engine.setdefault(worker, {})

    def remove_worker(self, worker: str) -> None:
        super().remove_worker(worker)
        for index in self.lower.values():
            index.remove_worker(worker)
        self._engine.pop(worker, None)
        self._warned.discard(worker)
        for tier in Tier:
            self._silent.pop((worker, tier), None)

    def clear_worker(self, worker: str) -> None:
        super().clear_worker(worker)
        for index in self.lower.values():
            index.clear_worker(worker)
        engine = self._engine.get(worker)
        if engine is not None:
            engine.clear()
        for tier in Tier:
            silent = self._silent.get((worker, tier))
            if silent is not None:
                silent[1].clear()

    def set_silent_tier(self, worker: str, tier: Tier, capacity_blocks: int) -> None:
        """``worker`` publishes no evictions from ``tier`` (LMCache's CPU tier): believe
        it holds only the ``capacity_blocks`` most recently stored blocks (LRU estimate)."""
        if tier is Tier.GPU or capacity_blocks < 0:
            raise ValueError(f"a silent tier is an offload tier of >= 0 blocks, got {tier.name}")
        self._silent[worker, tier] = (capacity_blocks, OrderedDict())

    def silent_capacity(self, worker: str, tier: Tier) -> int | None:
        """The capacity :meth:`set_silent_tier` gave, None if the tier reports evictions."""
        silent = self._silent.get((worker, tier))
        return None if silent is None else silent[0]

    def tier_blocks(self, worker: str, tier: Tier) -> int:
        """Distinct blocks ``worker`` holds in ``tier``."""
        return self._tier_index(tier).tree_size(worker)

    def find_tier_matches(self, hashes: Sequence[int]) -> dict[str, tuple[int, int, int]]:
        """Per worker, how many leading blocks of ``hashes`` it holds in GPU memory, in GPU
        or host memory, and in any tier (three nested depths, each contiguous from block
        0); workers with none are left out. Without offloaded blocks anywhere it is
        :meth:`find_matches` (one walk)."""
        host, disk = self.lower[Tier.HOST]._holders, self.lower[Tier.DISK]._holders
        if not host and not disk:
            return {w: (n, n, n) for w, n in self.find_matches(hashes).items()}
        gpu = self._holders
        depths: dict[str, list[int]] = {}
        live = [0, 0, 0]
        for depth, h in enumerate(hashes):
            g = gpu.get(h, 0)
            masks = (g, g | host.get(h, 0), g | host.get(h, 0) | disk.get(h, 0))
            if not depth:
                live = list(masks)
            else:
                for level in range(3):
                    nxt = live[level] & masks[level]
                    for worker in self._bits(live[level] & ~nxt):
                        depths.setdefault(worker, [0, 0, 0])[level] = depth
                    live[level] = nxt
            if not live[2]:
                break
        else:
            for level in range(3):
                for worker in self._bits(live[level]):
                    depths.setdefault(worker, [0, 0, 0])[level] = len(hashes)
        return {w: (d[0], d[1], d[2]) for w, d in depths.items()}

    def apply_batch(self, worker: str, batch: KVEventBatch) -> None:
        """Apply a batch of ``worker``'s events in order (ignored for unknown workers)."""
        for event in batch.events:
            self.apply(worker, event)

    def apply(self, worker: str, event: KVEvent) -> None:
        engine = self._engine.get(worker)
        if engine is None:
            return
        if isinstance(event, BlockStored):
            tier = tier_of(event.medium)
            # An adapter's blocks are known by name (their chain is seeded with it); a
            # bare lora_id (vLLM before 0.11) names nothing we could hash.
            if tier is not None and (event.lora_id is None or event.lora_name is not None):
                self._stored(worker, engine, event, tier)
        elif isinstance(event, BlockRemoved):
            tier = tier_of(event.medium)
            if tier is not None:
                self._removed(worker, engine, event.block_hashes, tier)
        else:
            self.clear_worker(worker)

    def _stored(
        self,
        worker: str,
        engine: dict[ExternalBlockHash, Entry],
        event: BlockStored,
        tier: Tier,
    ) -> None:
        bs = self.block_size
        if not event.token_ids and all(b in engine for b in event.block_hashes):
            # vLLM's offload connector without self-describing events: no tokens, but the
            # blocks are ones we know from their GPU life.
            ours = [engine[b][0] for b in event.block_hashes]
        elif event.block_size != bs:
            if worker not in self._warned:
                self._warned.add(worker)
                log.warning(
                    "%s publishes blocks of %d tokens, the router hashes %d: its"
                    " KV events are ignored (set the router's block size to the engine's)",
                    worker,
                    event.block_size,
                    bs,
                )
            return
        else:
            parent = adapter_parent(event.lora_name)
            if event.parent_block_hash is not None:
                known = engine.get(event.parent_block_hash)
                if known is None:
                    self.dropped_orphans += len(event.block_hashes)
                    return
                parent = known[0]
            ours = self._our_hashes(event, parent)
        added: list[int] = []
        silent = self._silent.get((worker, tier))
        for block, mine in zip(event.block_hashes, ours, strict=False):
            # A second copy of a known hash (another block, another tier) keeps its
            # first identity.
            entry = engine.get(block) or (mine, 0, 0, 0)
            if silent is not None:
                if block in silent[1]:
                    silent[1].move_to_end(block)
                    engine[block] = entry
                    continue  # stored again: counted once, it only gets younger
                silent[1][block] = None
            engine[block] = _counted(entry, tier, 1)
            added.append(entry[0])
        self._tier_index(tier).add(worker, added)
        if silent is not None and len(silent[1]) > silent[0]:
            self._age_out(worker, engine, tier, silent)

    def _our_hashes(self, event: BlockStored, parent: int | None) -> list[int]:
        """Our hashes of a store's blocks, chained from ``parent`` (ours).

        An engine that names blocks by our own hashes (the mocker) is trusted once the
        first block checks out: hashing it costs two xxh3 calls where the whole event
        costs two a block (a 32k-token prompt: ~4,000). Another engine's name for block 0
        equals ours by chance with odds of 2**-64. A short token list hashes fewer
        blocks; zip drops the engine hashes left over, which later stores then see as
        unknown parents."""
        bs = self.block_size
        blocks, tokens = event.block_hashes, event.token_ids
        count = min(len(blocks), len(tokens) // bs)
        if not count:
            return []
        first = sequence_hashes(tokens[:bs], bs, parent)[0]
        if blocks[0] == first:
            self.trusted_blocks += count
            return cast(list[int], blocks[:count])  # ints: block 0 is one of ours
        # Another engine's names: the rest of the chain continues from block 0's hash.
        return [first, *sequence_hashes(tokens[bs : count * bs], bs, first)]

    def _age_out(
        self,
        worker: str,
        engine: dict[ExternalBlockHash, Entry],
        tier: Tier,
        silent: tuple[int, OrderedDict[ExternalBlockHash, None]],
    ) -> None:
        capacity, lru = silent
        old: list[ExternalBlockHash] = []
        while len(lru) > capacity:
            old.append(lru.popitem(last=False)[0])
        self.aged_out += len(old)
        self._uncount(worker, engine, old, tier)

    def _removed(
        self,
        worker: str,
        engine: dict[ExternalBlockHash, Entry],
        blocks: Iterable[ExternalBlockHash],
        tier: Tier,
    ) -> None:
        silent = self._silent.get((worker, tier))
        if silent is not None:  # it does report some after all: follow them
            blocks = [b for b in blocks if silent[1].pop(b, 0) is None]
        self._uncount(worker, engine, blocks, tier)

    def _uncount(
        self,
        worker: str,
        engine: dict[ExternalBlockHash, Entry],
        blocks: Iterable[ExternalBlockHash],
        tier: Tier,
    ) -> None:
        gone: list[int] = []
        slot = 1 + tier
        for block in blocks:
            entry = engine.get(block)
            if entry is None or not entry[slot]:
                continue  # never seen here (an orphan, or stored before we joined)
            entry = _counted(entry, tier, -1)
            if entry[1] or entry[2] or entry[3]:
                engine[block] = entry
            else:
                del engine[block]
            gone.append(entry[0])
        self._tier_index(tier).discard(worker, gone)

    def engine_blocks(self, worker: str) -> int:
        """Engine hashes known for ``worker`` (tests, metrics)."""
        return len(self._engine.get(worker, ()))
