"""KV cache tiers: which memory holds a block, and what a hit there is worth.

Engines name a block's tier with the ``medium`` of its KV events (vLLM 0.32: ``GPU``,
``CPU``, ``STORAGE``; LMCache outside its multi-process mode writes ``cpu``). A hit in a
lower tier saves the block's prefill but costs its transfer into GPU memory, so it is
worth a fraction of a GPU hit, its *credit* (docs/router.md, "Tiers")::

    credit = max(0, 1 - onboard_ms / recompute_ms)
    onboard_ms = block_bytes / bandwidth,   recompute_ms = block_size x prefill_ms_per_token
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from dynamoctl.wire.kv_events import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE


class Tier(enum.IntEnum):
    """Where a KV block lives, best (fastest to use) first."""

    GPU = 0
    HOST = 1
    DISK = 2

    @property
    def medium(self) -> str:
        """The ``medium`` vLLM publishes for this tier."""
        return _MEDIUM[self]


_MEDIUM: Final = {Tier.GPU: MEDIUM_GPU, Tier.HOST: MEDIUM_CPU, Tier.DISK: MEDIUM_STORAGE}
_BY_MEDIUM: Final = {
    MEDIUM_GPU: Tier.GPU,
    MEDIUM_CPU: Tier.HOST,
    MEDIUM_STORAGE: Tier.DISK,
    "DISK": Tier.DISK,  # Dynamo's KVBM names its local-disk tier so
}


def tier_of(medium: str | None) -> Tier | None:
    """The tier of an event's ``medium``; None (vLLM before 0.9) is GPU; an unknown
    medium is None (its events are ignored rather than guessed)."""
    if medium is None:
        return Tier.GPU
    return _BY_MEDIUM.get(medium.upper())


def onboard_credit(
    block_bytes: int, gbps: float, prefill_ms_per_token: float, block_size: int
) -> float:
    """Fraction of a GPU hit's worth that a hit in a tier of bandwidth ``gbps`` (GB/s,
    1e9 bytes) keeps: the prefill it saves minus the transfer it costs, in [0, 1]."""
    onboard_ms = block_bytes / (gbps * 1e9) * 1e3
    recompute_ms = block_size * prefill_ms_per_token
    return max(0.0, min(1.0, 1.0 - onboard_ms / recompute_ms))


DEFAULT_HOST_GBPS: Final = 25.0
"""Host-to-GPU bandwidth assumed by default, GB/s: pinned memory over PCIe 5 x16."""
DEFAULT_DISK_GBPS: Final = 10.0
"""Disk-to-GPU bandwidth assumed by default, GB/s: one PCIe 5 NVMe drive."""

# The default credits' assumptions: Llama-3-8B in bf16 (131072 KV bytes per token),
# 64-token blocks, 1.518e-2 ms of prefill per token (the mocker's timing model, an H100)
# and the bandwidths above. A block's onboard/recompute ratio does not depend on the
# block size, so they hold for any block size.
_BLOCK_BYTES: Final = 64 * 131072
_PREFILL_MS_PER_TOKEN: Final = 1.518344e-2
DEFAULT_HOST_CREDIT: Final = round(
    onboard_credit(_BLOCK_BYTES, DEFAULT_HOST_GBPS, _PREFILL_MS_PER_TOKEN, 64), 2
)
"""Host-memory hit worth (0.65): see the assumptions above."""
DEFAULT_DISK_CREDIT: Final = round(
    onboard_credit(_BLOCK_BYTES, DEFAULT_DISK_GBPS, _PREFILL_MS_PER_TOKEN, 64), 2
)
"""Disk hit worth (0.14): see the assumptions above."""


@dataclass(slots=True)
class TierStats:
    """Sizes and counters of one tier of one engine (the worker's ``/metrics``)."""

    tier: Tier
    capacity_blocks: int
    used_blocks: int = 0
    offloaded_blocks: int = 0
    """Blocks written into this tier (GPU: blocks registered in the prefix cache)."""
    onboarded_blocks: int = 0
    """Blocks loaded from this tier into GPU memory (GPU: 0)."""
    hit_blocks: int = 0
    """Prompt blocks found in this tier at admission (GPU: prefix-cache hits)."""
    lookup_blocks: int = 0
    """Prompt blocks looked up at admission (all tiers' hit-rate denominator)."""
    full: bool = False
    """Offload into this tier stopped because its storage has no room (disk)."""
    skipped_full_blocks: int = 0
    """Blocks not written because the storage was full."""
