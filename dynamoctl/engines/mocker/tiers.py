"""KV cache tiers below the GPU pool: host memory, then disk (docs/mocker.md, "KV tiers").

The mocker simulates what a KV block manager does (docs/architecture.md, KV tiers):

* a block the GPU pool evicts is **offloaded** to the host tier (deduplicated by sequence
  hash: a block already there is only touched), which evicts its least recently used
  block to make room; that block goes to the disk tier if it passes the **disk-offload
  frequency filter** (frequency starts at 1, doubles on each prefix hit, decays by 1 per
  ``disk_filter_decay_s`` of simulated time; a block is written to disk only at
  frequency >= 2, which keeps one-off prompts from wearing the disk), and the disk tier
  drops its own least recently used. A block's frequency outlives the block, as the
  reference's filter keeps its own bounded map: a prompt recomputed after every tier lost
  it is a reuse too (its blocks are stored again), else a working set larger than the
  host tier, whose blocks are never hit before the host drops them, never reaches disk;
* at admission, the prompt blocks that follow the GPU prefix hit and sit in the host or
  disk tier (contiguously) are **onboarded**: they take fresh GPU blocks, count as cached
  tokens, and the step that admits the request lasts ``blocks x block_bytes / bandwidth``
  longer per tier, on the mocker's clock (no sleep). Copies stay in their tier (touched),
  as a write-through cache keeps them;
* every change is published as vLLM's offloading connector does: ``BlockStored`` /
  ``BlockRemoved`` with ``medium`` ``CPU`` (host) or ``STORAGE`` (disk), the engine's
  block hashes, the parent's hash and the block's tokens (vLLM's self-describing events);
* a disk tier with a ``disk_path`` checks the path's free space (the simulated blocks
  would be files there): when it cannot hold one more block, disk offload stops, serving
  goes on, a log line says so once and :attr:`~dynamoctl.kv.tiers.TierStats.full` reports it.

Offloads (device to host) are charged no time: they run off the critical path in the
engines modelled. The GPU pool calls :meth:`KvTiers.on_pool_event` for each event it
records (:class:`~dynamoctl.engines.mocker.block_pool.BlockPool` ``listener``) and
records its own events in the pool's list, so subscribers see one ordered stream.
"""

from __future__ import annotations

import logging
import shutil
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.kv.tiers import Tier, TierStats
from dynamoctl.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
)

log = logging.getLogger(__name__)

DISK_FILTER_MIN_FREQUENCY: Final = 2
"""A block is written to disk only at this frequency or above (the reference's filter)."""
_FREQUENCY_CAP: Final = 1 << 20
_FREE_SPACE_RECHECK_S: Final = 1.0


@dataclass(slots=True)
class _Block:
    """What a tier must know to publish a block: its place in its sequence and tokens."""

    parent: int | None
    tokens: array[int]
    depth: int
    """Position in its sequence (0: first block); offloads publish parents first."""
    frequency: int = 1
    since: float = 0.0
    """Simulated time ``frequency`` was last updated at (decay is applied lazily)."""


class _LowerTier:
    """One LRU pool of block hashes with a capacity and an onboard bandwidth."""

    def __init__(self, tier: Tier, capacity: int, gbps: float) -> None:
        self.lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.gbps = gbps
        self.medium = tier.medium
        self.stats = TierStats(tier, capacity)

    def __contains__(self, h: int) -> bool:
        return h in self.lru


class KvTiers:
    """The host and disk tiers of one engine (see the module docstring)."""

    def __init__(self, config: MockerConfig, emit: Callable[[KVEvent], None]) -> None:
        self.config = config
        self._emit = emit
        """Where events go: the GPU pool's list, so that they keep their order."""
        self.block_size = config.block_size
        self.block_bytes = config.block_bytes
        self.gpu = TierStats(Tier.GPU, config.num_gpu_blocks)
        self.host = _LowerTier(Tier.HOST, config.num_host_blocks, config.host_gbps)
        self.disk = _LowerTier(Tier.DISK, config.num_disk_blocks, config.disk_gbps)
        self._blocks: dict[int, _Block] = {}  # hash -> block, while in any tier
        self._in_gpu: set[int] = set()
        self._pending: set[int] = set()  # evicted from GPU, on their way to the host
        # Frequencies of blocks no tier holds (hash -> (frequency, since)), oldest first,
        # bounded by what the tiers can hold: the filter's memory of past reuse.
        self._history: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._history_cap = config.num_gpu_blocks + config.num_host_blocks + config.num_disk_blocks
        self._now = 0.0
        self._free_checked_at = -_FREE_SPACE_RECHECK_S
        self._free_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.host.stats.capacity_blocks > 0

    def stats(self, gpu_cached: int) -> list[TierStats]:
        """GPU (``gpu_cached`` blocks in its prefix cache), host and disk (tiers of
        capacity 0 left out)."""
        self.gpu.used_blocks = gpu_cached
        out = [self.gpu]
        for tier in (self.host, self.disk):
            if tier.stats.capacity_blocks:
                tier.stats.used_blocks = len(tier.lru)
                tier.stats.lookup_blocks = self.gpu.lookup_blocks
                out.append(tier.stats)
        return out

    def set_time(self, now: float) -> None:
        """The engine's simulated time (the frequency filter's decay runs on it)."""
        self._now = now

    # ------------------------------------------------------------------ from the GPU pool

    def on_pool_event(self, event: KVEvent) -> None:
        """Follow the GPU pool: remember stored blocks, offload evicted ones."""
        if isinstance(event, BlockStored):
            self.gpu.offloaded_blocks += len(event.block_hashes)
        if not self.enabled:
            return  # nothing to offload to: keep no per-block state
        if isinstance(event, BlockStored):
            bs = event.block_size
            parent = event.parent_block_hash
            known = self._blocks.get(parent) if isinstance(parent, int) else None
            depth = known.depth + 1 if known is not None else 0
            for i, h in enumerate(event.block_hashes):
                assert isinstance(h, int)  # the mocker names blocks with u64 hashes
                if h not in self._blocks:
                    tokens = array("I", event.token_ids[i * bs : (i + 1) * bs])
                    block = _Block(parent if isinstance(parent, int) else None,
                                   tokens, depth, since=self._now)  # fmt: skip
                    self._blocks[h] = block
                    self._remembered(h, block)
                self._in_gpu.add(h)
                parent, depth = h, depth + 1
        elif isinstance(event, BlockRemoved):
            hashes = [h for h in event.block_hashes if isinstance(h, int)]
            self._in_gpu.difference_update(hashes)
            self._offload(hashes)
        elif isinstance(event, AllBlocksCleared):
            self._in_gpu.clear()  # the published clear drops every tier for subscribers
            self.host.lru.clear()
            self.disk.lru.clear()
            self._blocks.clear()
            self._history.clear()

    def _offload(self, hashes: list[int]) -> None:
        fresh = []
        for h in hashes:  # touch first, so that making room cannot evict one of them
            if h in self.host:
                self.host.lru.move_to_end(h)
            else:
                fresh.append(h)
        self._pending = set(fresh)  # not to be forgotten while room is made for them
        # Parents first: a subscriber resolves a block's identity through its parent.
        by_depth = sorted(fresh, key=lambda h: self._blocks[h].depth)
        for h in by_depth:
            self._make_room(self.host)
            self._put(self.host, h)
            self._pending.discard(h)
        self._children_older(self.host, by_depth)

    @staticmethod
    def _children_older(tier: _LowerTier, chain: Sequence[int]) -> None:
        """Make ``chain`` (parents first) most recently used, its deepest block least:
        a tier evicts a prefix's tail before its root, as the GPU pool does, so that it
        never keeps blocks whose parent it dropped (unreachable from block 0)."""
        lru = tier.lru
        for h in reversed(chain):
            if h in lru:
                lru.move_to_end(h)

    def _make_room(self, tier: _LowerTier) -> None:
        while len(tier.lru) >= tier.stats.capacity_blocks:
            victim, _ = tier.lru.popitem(last=False)
            self._emit(BlockRemoved(block_hashes=[victim], medium=tier.medium))
            if tier is self.host and self._disk_takes(victim):
                if victim in self.disk:
                    self.disk.lru.move_to_end(victim)
                else:
                    self._make_room(self.disk)
                    self._put(self.disk, victim)
            self._forget_if_gone(victim)

    def _put(self, tier: _LowerTier, h: int) -> None:
        tier.lru[h] = None
        tier.stats.offloaded_blocks += 1
        block = self._blocks[h]
        self._emit(
            BlockStored(
                block_hashes=[h],
                parent_block_hash=block.parent,
                token_ids=block.tokens.tolist(),
                block_size=self.block_size,
                medium=tier.medium,
            )
        )

    def _disk_takes(self, h: int) -> bool:
        disk = self.disk
        if not disk.stats.capacity_blocks:
            return False
        if self.config.disk_offload_filter and self._frequency(h) < DISK_FILTER_MIN_FREQUENCY:
            return False
        if h not in disk and not self._disk_has_room():
            disk.stats.skipped_full_blocks += 1
            return False
        return True

    def _disk_has_room(self) -> bool:
        """Whether the disk path can hold one more block (always, without a path)."""
        path = self.config.disk_path
        if path is None:
            return True
        now = time.monotonic()
        if now - self._free_checked_at >= _FREE_SPACE_RECHECK_S:
            self._free_checked_at = now
            try:
                self._free_bytes = shutil.disk_usage(path).free
            except OSError as exc:
                log.warning("[mocker/kv-tiers] cannot stat disk tier %s: %s", path, exc)
                self._free_bytes = 0
        # The simulated blocks would be files on the path: count them against its room.
        room = self._free_bytes - (len(self.disk.lru) + 1) * self.block_bytes >= 0
        stats = self.disk.stats
        if room == stats.full:  # a transition: say it once
            stats.full = not room
            if room:
                log.info("[mocker/kv-tiers] disk tier %s has room again: offload resumes", path)
            else:
                log.warning(
                    "[mocker/kv-tiers] disk tier %s is full (%d bytes free, %d-byte blocks, "
                    "%d held): disk offload stops, serving continues",
                    path, self._free_bytes, self.block_bytes, len(self.disk.lru),
                )  # fmt: skip
        return room

    def _forget_if_gone(self, h: int) -> None:
        gone = h not in self._in_gpu and h not in self.host and h not in self.disk
        if gone and h not in self._pending:
            block = self._blocks.pop(h, None)
            if block is not None and self._history_cap:
                self._history[h] = (self._frequency_of(block), self._now)
                if len(self._history) > self._history_cap:
                    self._history.popitem(last=False)

    def _remembered(self, h: int, block: _Block) -> None:
        """A block stored again after every tier dropped it was reused: its remembered
        frequency doubles, as a hit's would."""
        past = self._history.pop(h, None)
        if past is not None:
            frequency, since = past
            decayed = int((self._now - since) / self.config.disk_filter_decay_s)
            block.frequency = min(_FREQUENCY_CAP, max(1, frequency - decayed) * 2)

    def _frequency(self, h: int) -> int:
        return self._frequency_of(self._blocks[h])

    def _frequency_of(self, block: _Block) -> int:
        decayed = int((self._now - block.since) / self.config.disk_filter_decay_s)
        return max(0, block.frequency - decayed)

    # ------------------------------------------------------------------ admission

    def note_hits(self, hashes: Sequence[int]) -> None:
        """``hashes`` were prefix hits (any tier): their frequency doubles."""
        blocks, now = self._blocks, self._now
        if not blocks:
            return
        for h in hashes:
            block = blocks.get(h)
            if block is not None:
                block.frequency = min(_FREQUENCY_CAP, max(1, self._frequency(h)) * 2)
                block.since = now

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` (those after the GPU hit) a lower tier holds."""
        if not self.enabled:
            return 0
        n = 0
        for h in hashes:
            if h not in self.host and h not in self.disk:
                break
            n += 1
        return n

    def onboard(self, hashes: Sequence[int]) -> float:
        """Load ``hashes`` (a :meth:`match`) into GPU memory: seconds it takes."""
        seconds = 0.0
        per_block = self.block_bytes / 1e9
        for h in hashes:
            tier = self.host if h in self.host else self.disk
            tier.stats.onboarded_blocks += 1
            tier.stats.hit_blocks += 1
            seconds += per_block / tier.gbps
        self._children_older(self.host, hashes)
        self._children_older(self.disk, hashes)
        return seconds

    def record_lookup(self, looked_up: int, gpu_hits: int) -> None:
        """Admission looked up ``looked_up`` prompt blocks; ``gpu_hits`` were in GPU."""
        self.gpu.lookup_blocks += looked_up
        self.gpu.hit_blocks += gpu_hits
