"""KV hand-off between mockers (docs/architecture.md): pinned prefills on one side, pulls
on the other.

Prefill side: a request run with ``{"do_remote_decode": true}`` keeps its blocks held in
the :class:`~dynamoctl.engines.mocker.scheduler.Scheduler` when it finishes;
:meth:`KvTransfers.pin` names them with a transfer id and returns the hand-off for the
request's last chunk. The worker serves ``kv_pull`` (:meth:`KvTransfers.serve_pull`):
a pull unpins the blocks and answers how many there were. Blocks nobody pulls within
``kv_pin_ttl`` seconds are unpinned, so a lost decode request cannot leak KV.

Decode side: :meth:`KvTransfers.pull` asks the named prefill worker, then waits the
simulated transfer time (``blocks x block bytes / kv_transfer_gbps``) on the engine's
clock; the engine then admits the request with its prompt computed. Any failure
(prefill worker gone, unknown or expired transfer, a hand-off for another prompt) is a
:class:`KvTransferFailed`, bounded by ``pull_timeout``: the request fails, never hangs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import msgspec

from dynamoctl.engines.api import KvTransferFailed
from dynamoctl.engines.mocker.clock import Clock
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.scheduler import Scheduler
from dynamoctl.kv import hashing
from dynamoctl.planes.request import RequestClient, RequestPlaneError
from dynamoctl.wire import kv_transfer
from dynamoctl.wire.kv_transfer import KvPullReply, KvPullRequest, MockerHandoff

log = logging.getLogger(__name__)


@dataclass
class _Pinned:
    request_id: str
    num_blocks: int
    block_hashes: list[int]
    expiry: asyncio.TimerHandle


@dataclass
class TransferStats:
    """Counters since start (tests, benchmarks, debugging)."""

    pinned: int = 0
    """Prefills whose blocks were pinned for a remote decode."""
    pulled: int = 0
    """Pins taken by a decode worker."""
    expired: int = 0
    """Pins freed by the TTL, never pulled."""
    received_blocks: int = 0
    """Blocks this engine pulled from prefill workers."""
    transfer_s: float = 0.0
    """Simulated seconds spent waiting for pulled KV."""


class KvTransfers:
    """One mocker's pinned prefills and pulls."""

    def __init__(
        self, config: MockerConfig, scheduler: Scheduler, clock: Clock, pull_timeout: float = 10.0
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.clock = clock
        self.pull_timeout = pull_timeout
        """Seconds (real) a pull may take before the request fails."""
        self.address: str | None = None
        """This worker's request-plane address (named in hand-offs); None outside a worker."""
        self.stats = TransferStats()
        self._pins: dict[str, _Pinned] = {}
        self._client: RequestClient | None = None

    # ------------------------------------------------------------------ prefill side

    def pin(self, request_id: str, prompt: Sequence[int]) -> MockerHandoff:
        """Name the held blocks of finished pinned request ``request_id``."""
        seq = self.scheduler.pinned(request_id)
        if seq is None or self.address is None:
            raise RuntimeError(f"request {request_id!r} has no pinned blocks to hand off")
        tid = uuid.uuid4().hex
        bs = self.config.block_size
        parent = hashing.adapter_parent(seq.adapter)  # a LoRA adapter's blocks are its own
        hashes = hashing.sequence_hashes(prompt[: len(prompt) // bs * bs], bs, parent)
        expiry = asyncio.get_running_loop().call_later(self.config.kv_pin_ttl, self._expire, tid)
        self._pins[tid] = _Pinned(request_id, len(seq.blocks), hashes, expiry)
        self.stats.pinned += 1
        return MockerHandoff(
            remote_address=self.address,
            transfer_id=tid,
            num_blocks=len(seq.blocks),
            block_hashes=hashes,
        )

    @property
    def num_pinned(self) -> int:
        """Transfers waiting to be pulled."""
        return len(self._pins)

    async def serve_pull(self, body: bytes) -> AsyncIterator[bytes]:
        """The ``kv_pull`` endpoint: unpin a transfer, answer what it held."""
        tid = kv_transfer.decode_pull(body).transfer_id
        pinned = self._pins.pop(tid, None)
        if pinned is None:
            raise KvTransferFailed(f"unknown or expired KV transfer {tid!r} on {self.address}")
        pinned.expiry.cancel()
        self.scheduler.unpin(pinned.request_id)
        self.stats.pulled += 1
        reply = KvPullReply(pinned.num_blocks, pinned.block_hashes, self.config.block_bytes)
        yield kv_transfer.encode(reply)

    def _expire(self, tid: str) -> None:
        pinned = self._pins.pop(tid, None)
        if pinned is not None:
            self.scheduler.unpin(pinned.request_id)
            self.stats.expired += 1
            log.warning("[mocker] KV transfer %s expired unpulled; blocks freed", tid)

    # ------------------------------------------------------------------ decode side

    async def pull(
        self, handoff: MockerHandoff, prompt: Sequence[int], adapter: str | None = None
    ) -> None:
        """Take the hand-off's blocks (of ``prompt`` under LoRA ``adapter``) and wait the
        simulated transfer time. :class:`KvTransferFailed` on any failure."""
        bs = self.config.block_size
        where = f"KV transfer {handoff.transfer_id} from {handoff.remote_address}"
        full = prompt[: len(prompt) // bs * bs]
        if handoff.block_hashes != hashing.sequence_hashes(
            full, bs, hashing.adapter_parent(adapter)
        ):
            raise KvTransferFailed(f"{where} is for another prompt or block size")
        if handoff.num_blocks * bs < len(prompt):
            raise KvTransferFailed(f"{where} has {handoff.num_blocks} blocks: too few")
        try:
            reply = await asyncio.wait_for(self._ask(handoff), self.pull_timeout)
        except (RequestPlaneError, asyncio.TimeoutError, msgspec.DecodeError) as exc:
            if isinstance(exc, RequestPlaneError) and self._client is not None:
                # The prefill worker is gone or broken: do not keep a socket (reconnecting,
                # pinged every second) to an address a restarted worker will not reuse.
                await self._client.disconnect(handoff.remote_address)
            raise KvTransferFailed(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        seconds = reply.num_blocks * reply.block_bytes / (self.config.kv_transfer_gbps * 1e9)
        await self.clock.sleep(seconds)
        self.stats.received_blocks += reply.num_blocks
        self.stats.transfer_s += seconds

    async def _ask(self, handoff: MockerHandoff) -> KvPullReply:
        if self._client is None:
            self._client = RequestClient()
        body = kv_transfer.encode(KvPullRequest(handoff.transfer_id))
        async for raw in self._client.stream(handoff.remote_address, kv_transfer.KV_PULL, body):
            return kv_transfer.decode_reply(raw)
        raise KvTransferFailed(f"{handoff.remote_address} answered the pull with nothing")

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Forget every pin (the scheduler's clear releases their blocks) and the client."""
        for pinned in self._pins.values():
            pinned.expiry.cancel()
        self._pins.clear()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
