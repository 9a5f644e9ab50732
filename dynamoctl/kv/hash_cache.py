"""Sequence hashes of recent prompts, so a prompt that extends one of them hashes only its
new blocks (docs/architecture.md, "Routing"; the tokenisation prefix cache's counterpart).

An agent resends its whole history every turn: turn ``k + 1``'s ids start with turn
``k``'s, and hashing ~2000 blocks of a 32k-token prompt costs the router ~1.5-3 ms of its
request path every turn. A cached run is reused only when its packed ids are byte-equal to
the start of the new prompt's (one ``memcmp``), so the hashes are exactly
:func:`~dynamoctl.kv.hashing.sequence_hashes`'; runs are found by their first block's hash,
and a run that the new prompt extends is replaced by it (one entry per conversation).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import xxhash

from dynamoctl.kv.hashing import SEED, chain, le_u32, sequence_hashes

_xxh3: Final = xxhash.xxh3_64_intdigest

MIN_BLOCKS = 64
"""Shorter prompts are hashed afresh (under ~0.1 ms; an entry would not pay)."""


class _Run:
    __slots__ = ("head", "packed", "sequence")

    def __init__(self, head: int, packed: bytes, sequence: tuple[int, ...]) -> None:
        self.head = head
        self.packed = packed
        """LE-u32 ids of the run's full blocks."""
        self.sequence = sequence
        """Their sequence hashes."""


class HashCache:
    """Least recently used prompts' sequence hashes for one block size, at most
    ``max_blocks`` blocks in all (~100 bytes a block: 2^15 is ~3 MB). ``parent`` starts
    every chain (a LoRA adapter's :func:`~dynamoctl.kv.hashing.adapter_parent`)."""

    def __init__(
        self, block_size: int, max_blocks: int = 1 << 15, parent: int | None = None
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.parent = parent
        self._runs: OrderedDict[int, _Run] = OrderedDict()  # key: the run's last hash
        self._by_head: dict[int, set[int]] = {}  # first block's hash -> keys of its runs
        self._blocks = 0
        self.hits = 0
        """Prompts that reused a cached run."""
        self.reused_blocks = 0
        """Blocks whose hashes came from the cache."""

    def sequence_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The sequence hash of every full block of ``token_ids`` (a fresh list)."""
        bs = self.block_size
        n_blocks = len(token_ids) // bs
        if n_blocks < MIN_BLOCKS or n_blocks > self.max_blocks // 4:
            return sequence_hashes(token_ids, bs, self.parent)
        full = n_blocks * bs
        # The whole prompt packed, then cut to its full blocks: slicing a list first would
        # copy it once more.
        packed = memoryview(le_u32(token_ids))[:full].tobytes()
        step = 4 * bs
        head = _xxh3(packed[:step], seed=SEED)
        base = self._longest_prefix(head, packed)
        done = len(base.packed) if base is not None else 0
        view = memoryview(packed)
        local = [_xxh3(view[i : i + step], seed=SEED) for i in range(done, len(packed), step)]
        if base is None:
            out = chain(local, self.parent)
        else:
            out = [*base.sequence, *chain(local, base.sequence[-1])]
            self.hits += 1
            self.reused_blocks += len(base.sequence)
        self._remember(_Run(head, packed, tuple(out)), base)
        return out

    def _longest_prefix(self, head: int, packed: bytes) -> _Run | None:
        best: _Run | None = None
        for key in self._by_head.get(head, ()):
            run = self._runs[key]
            size = len(run.packed)
            longer = best is None or size > len(best.packed)
            if size <= len(packed) and longer and packed.startswith(run.packed):
                best = run
        if best is not None:
            self._runs.move_to_end(best.sequence[-1])
        return best

    def _remember(self, run: _Run, base: _Run | None) -> None:
        key = run.sequence[-1]
        if base is not None and base.sequence[-1] != key:
            self._drop(base.sequence[-1])  # the new run extends it: one entry a conversation
        if key in self._runs:
            self._runs.move_to_end(key)
            return
        self._runs[key] = run
        self._by_head.setdefault(run.head, set()).add(key)
        self._blocks += len(run.sequence)
        while self._blocks > self.max_blocks:
            self._drop(next(iter(self._runs)))

    def _drop(self, key: int) -> None:
        run = self._runs.pop(key)
        self._blocks -= len(run.sequence)
        keys = self._by_head[run.head]
        keys.discard(key)
        if not keys:
            del self._by_head[run.head]
