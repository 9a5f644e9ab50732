"""The mocker as an embedding model (``task: embed``, docs/mocker.md): one vector per
prompt, a pure function of its tokens, after its prefill is simulated; ``dimensions``
only where the model allows it; text generation refused, and the reverse."""

from __future__ import annotations

import math

import pytest

from dynamoctl.engines.api import RequestRejected
from dynamoctl.engines.mocker.clock import VirtualClock
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.engine import MockerEngine
from dynamoctl.wire.engine import GenerateChunk, GenerateRequest, Pooling


async def run(engine: MockerEngine, request: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in engine.generate(request)]


def embed(rid: str, ids: list[int], dimensions: int | None = None) -> GenerateRequest:
    return GenerateRequest(rid, ids, 1, pooling=Pooling(dimensions))


async def test_one_unit_vector_per_prompt_after_its_prefill() -> None:
    clock = VirtualClock()
    engine = MockerEngine(MockerConfig(task="embed", embedding_size=24, matryoshka=True),
                          clock=clock)  # fmt: skip
    await engine.start()
    try:
        assert engine.model_card.embedding is not None
        assert engine.model_card.embedding.size == 24
        started = clock.now()
        long = await run(engine, embed("a", list(range(1, 2001))))
        took_long = clock.now() - started
        started = clock.now()
        short = await run(engine, embed("b", [5, 6, 7]))
        took_short = clock.now() - started
        again = await run(engine, embed("c", [5, 6, 7]))
        cut = await run(engine, embed("d", [5, 6, 7], dimensions=8))
    finally:
        await engine.stop()
    for chunks in (long, short, again, cut):
        assert len(chunks) == 1 and chunks[0].token_ids == []
        assert chunks[0].finish_reason == "stop" and chunks[0].embedding is not None
    assert long[0].prompt_tokens == 2000
    assert took_long > took_short > 0  # a longer prompt's prefill takes longer
    vector = short[0].embedding or []
    assert len(vector) == 24 and math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)
    assert again[0].embedding == vector  # a pure function of the tokens
    head = vector[:8]
    scale = math.sqrt(sum(x * x for x in head))
    assert cut[0].embedding == pytest.approx([x / scale for x in head])


async def test_each_task_refuses_the_other() -> None:
    fixed = MockerEngine(MockerConfig(task="embed", embedding_size=16, speedup_ratio=100))
    text = MockerEngine(MockerConfig(speedup_ratio=100))
    await fixed.start()
    await text.start()
    try:
        assert text.model_card.embedding is None
        for engine, request in (
            (fixed, GenerateRequest("g", [1, 2], 4)),
            (fixed, embed("d", [1, 2], dimensions=8)),  # not a Matryoshka model
            (text, embed("e", [1, 2])),
        ):
            with pytest.raises(RequestRejected):
                await run(engine, request)
        assert len((await run(fixed, embed("f", [1, 2], dimensions=16)))[0].embedding or []) == 16
    finally:
        await fixed.stop()
        await text.stop()
