"""Helpers for engine tests: mockers on virtual clocks, and stream collection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dynamoctl.engines.api import FinishReason, GenerateChunk, GenerateRequest
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, VirtualClock
from dynamoctl.wire.kv_events import KVEventBatch


@dataclass
class Output:
    tokens: list[int] = field(default_factory=list)
    chunks: list[GenerateChunk] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """Virtual time at which each chunk was read."""

    @property
    def finish(self) -> FinishReason | None:
        return self.chunks[-1].finish_reason

    @property
    def cached(self) -> int | None:
        return self.chunks[0].cached_tokens


class Harness:
    """A started mocker on its own virtual clock, recording its KV event batches."""

    def __init__(self, **options: Any) -> None:
        self.clock = VirtualClock()
        self.engine = MockerEngine(MockerConfig(**options), clock=self.clock)
        self.batches: list[KVEventBatch] = []
        self.engine.set_kv_event_sink(self.batches.append)

    async def read(self, stream: AsyncIterator[GenerateChunk]) -> Output:
        out = Output()
        async for chunk in stream:
            out.chunks.append(chunk)
            out.tokens += chunk.token_ids
            out.times.append(self.clock.now())
        return out

    async def run(self, rid: str, prompt: list[int], max_tokens: int, **kw: Any) -> Output:
        return await self.read(self.engine.generate(GenerateRequest(rid, prompt, max_tokens, **kw)))


@pytest.fixture
async def make_mocker() -> AsyncIterator[Any]:
    made: list[Harness] = []

    async def make(**options: Any) -> Harness:
        harness = Harness(**options)
        await harness.engine.start()
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.engine.stop()
