"""Property: the KV event stream replayed from zero is the engine's prefix cache, always.

Random workloads on small pools (shared prefixes, bursts, aborts, preemption) check after
every published batch that a subscriber applying the events holds exactly the engine's
cached hashes, that it could recompute each stored hash from the event's tokens, and that
every request still gets exactly its own tokens.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamoctl.engines.api import GenerateRequest, RequestRejected
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, VirtualClock
from dynamoctl.engines.mocker.sampling import mock_token
from dynamoctl.kv import hashing
from dynamoctl.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@dataclass
class Client:
    prompt: list[int]
    max_tokens: int
    delay: int
    """Event-loop turns to wait before sending (lets earlier requests run first)."""
    abort_after: int | None
    """Chunks to read before aborting; None: read to the end."""


@st.composite
def workloads(draw: st.DrawFn) -> tuple[MockerConfig, list[Client]]:
    block_size = draw(st.sampled_from([1, 2, 4]))
    prefixes = draw(st.lists(st.lists(st.integers(0, 3), max_size=16), min_size=1, max_size=3))
    clients = [
        Client(
            prompt=draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(0, 3), max_size=6)),
            max_tokens=draw(st.integers(1, 16)),
            delay=draw(st.sampled_from([0, 0, 5, 20, 60])),
            abort_after=draw(st.none() | st.none() | st.integers(0, 6)),
        )
        for _ in range(draw(st.integers(1, 16)))
    ]
    config = MockerConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(4, 16)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 24)),
        vocab_size=4,  # tiny vocabulary: generated blocks collide and get shared too
    )
    return config, clients


class Replayer:
    """A subscriber's view of the cache, checked against the engine after every batch."""

    def __init__(self, engine: MockerEngine) -> None:
        self.engine = engine
        self.cached: set[int | bytes] = set()
        self.problems: list[str] = []

    def __call__(self, batch: KVEventBatch) -> None:
        bs = self.engine.config.block_size
        for event in batch.events:
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                assert not isinstance(parent, bytes)
                again = hashing.sequence_hashes(event.token_ids, bs, parent)
                if again != event.block_hashes:
                    self.problems.append(f"hashes not recomputable: {event}")
                if self.cached & set(event.block_hashes):
                    self.problems.append(f"stored twice: {event}")
                self.cached |= set(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                if not set(event.block_hashes) <= self.cached:
                    self.problems.append(f"removed unknown: {event}")
                self.cached -= set(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.cached.clear()
        if self.cached != self.engine.cached_block_hashes():
            self.problems.append("replayed cache differs from the engine's")
        try:
            self.engine.scheduler.check_invariants()
        except AssertionError as exc:
            self.problems.append(f"bookkeeping: {exc}")


async def run(config: MockerConfig, clients: list[Client]) -> None:
    engine = MockerEngine(config, clock=VirtualClock())
    replay = Replayer(engine)
    engine.set_kv_event_sink(replay)
    await engine.start()

    async def client(i: int, c: Client) -> None:
        for _ in range(c.delay):
            await asyncio.sleep(0)
        request = GenerateRequest(f"r{i}", c.prompt, c.max_tokens, seed=i, ignore_eos=True)
        tokens: list[int] = []
        reasons = []
        # The default context length is the pool's size in tokens.
        rejected = not c.prompt or len(c.prompt) + c.max_tokens > config.context_length
        try:
            stream = engine.generate(request)
            async for chunk in stream:
                tokens += chunk.token_ids
                reasons.append(chunk.finish_reason)
                if c.abort_after is not None and len(reasons) >= c.abort_after:
                    await engine.abort(request.request_id)
        except RequestRejected:
            assert rejected
            return
        assert not rejected
        assert tokens == [mock_token(i, k, config.vocab_size) for k in range(len(tokens))]
        if reasons[-1] != "abort":
            assert (reasons[-1], len(tokens)) == ("length", c.max_tokens)

    await asyncio.gather(*(client(i, c) for i, c in enumerate(clients)))
    metrics = engine.load_metrics()
    await engine.stop()
    assert replay.problems == []
    assert (metrics.active_blocks, metrics.num_running, metrics.num_waiting) == (0, 0, 0)
    assert replay.cached == engine.cached_block_hashes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_event_replay_reproduces_the_cache(workload: tuple[MockerConfig, list[Client]]) -> None:
    asyncio.run(run(*workload))
