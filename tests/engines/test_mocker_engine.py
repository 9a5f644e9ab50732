"""MockerEngine behaviour on a virtual clock: caching, preemption, stopping, aborts."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from dynamoctl.engines.api import (
    Engine,
    EngineStopped,
    GenerateRequest,
    RequestRejected,
)
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, RealClock
from dynamoctl.engines.mocker.sampling import mock_token, output_length
from dynamoctl.engines.mocker.scheduler import Scheduler
from dynamoctl.kv import hashing
from dynamoctl.wire.kv_events import BlockRemoved, BlockStored

PROMPT = list(range(1000, 1100))  # 100 tokens: 6 full blocks of 16 and a partial one


def test_is_an_engine() -> None:
    assert isinstance(MockerEngine(), Engine)
    card = MockerEngine(MockerConfig(num_gpu_blocks=10, block_size=8)).model_card
    assert (card.kv_capacity_blocks, card.block_size, card.context_length) == (10, 8, 80)


async def test_cached_tokens_are_the_full_blocks_of_the_shared_prefix(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100)
    assert (await m.run("a", PROMPT, 2)).cached == 0
    assert (await m.run("b", PROMPT, 2)).cached == 96
    assert (await m.run("c", PROMPT[:40] + [7] * 60, 2)).cached == 32  # 2 shared blocks
    assert (await m.run("d", PROMPT[:48] + [7] * 5, 2)).cached == 48  # 3 shared blocks
    # A fully cached, block-aligned prompt still computes its last block (as vLLM).
    assert (await m.run("e", PROMPT[:64], 2)).cached == 48
    first = (await m.run("f", PROMPT, 1)).chunks[0]
    assert (first.prompt_tokens, first.cached_tokens) == (100, 96)


async def test_memory_pressure_evicts_lru_blocks_and_reports_exactly_them(
    make_mocker: Any,
) -> None:
    m = await make_mocker(block_size=4, num_gpu_blocks=8)
    x = list(range(100, 113))  # 3 full blocks
    await m.run("x", x, 1)
    x_hashes = hashing.sequence_hashes(x, 4)
    assert m.engine.cached_block_hashes() == set(x_hashes)
    m.batches.clear()
    await m.run("y", list(range(500, 528)), 1)  # 7 blocks: 5 never used + 2 of x's
    removed = [e for b in m.batches for e in b.events if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved([x_hashes[2], x_hashes[1]], medium="GPU")]
    assert x_hashes[0] in m.engine.cached_block_hashes()
    assert (await m.run("x2", x, 1)).cached == 4


async def test_more_requests_than_blocks_all_complete_once(make_mocker: Any) -> None:
    m = await make_mocker(block_size=4, num_gpu_blocks=16, max_num_seqs=8)
    prompts = {f"r{i}": [i * 10 + j for j in range(10)] for i in range(12)}
    outs = await asyncio.gather(
        *(m.run(rid, p, 20, seed=i) for i, (rid, p) in enumerate(prompts.items()))
    )
    assert m.engine.num_preemptions > 0  # the scenario must exercise preemption
    alone = await make_mocker(block_size=4, num_gpu_blocks=16)
    for i, ((rid, p), out) in enumerate(zip(prompts.items(), outs, strict=True)):
        assert out.finish == "length"
        assert len(out.tokens) == 20
        assert out.tokens == (await alone.run(rid, p, 20, seed=i)).tokens
    assert m.engine.load_metrics().active_blocks == 0


async def test_lone_request_timing_is_the_model(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=1000)
    timing = m.engine.timing
    out = await m.run("a", PROMPT, 8)
    assert all(len(c.token_ids) == 1 for c in out.chunks)
    assert out.times[0] == pytest.approx(timing.prefill_ms(100) / 1e3, abs=1e-12)
    for g in range(1, 8):  # step g computes token g-1's KV: 100 + g tokens held
        u = math.ceil((100 + g) / 16) / 1000
        itl = out.times[g] - out.times[g - 1]
        assert itl == pytest.approx(timing.decode_ms(u) / 1e3, rel=1e-9)
    start = m.clock.now()
    again = await m.run("b", PROMPT, 1)  # 96 cached: only 4 tokens computed
    assert again.times[0] - start == pytest.approx(timing.prefill_ms(4) / 1e3, rel=1e-9)


async def test_chunked_prefill_timing(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=1000, max_num_batched_tokens=32)
    out = await m.run("a", PROMPT, 1)
    expected = sum(m.engine.timing.prefill_ms(n) for n in (32, 32, 32, 4)) / 1e3
    assert out.times[0] == pytest.approx(expected, rel=1e-9)
    assert m.engine.stats.steps == 4


async def test_step_with_prefill_and_decode_costs_both(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=1000)
    timing = m.engine.timing
    stream = m.engine.generate(GenerateRequest("a", PROMPT[:40], 6))
    times = []
    async for chunk in stream:
        times.append(m.clock.now())
        if len(times) == 3:  # joins the very next step
            b = asyncio.create_task(m.read(m.engine.generate(GenerateRequest("b", [5] * 50, 1))))
        assert chunk.token_ids
    assert (await b).times[0] == pytest.approx(times[3])
    # Step 4: a's decode (43 tokens held: 3 blocks) + b's prefill (50 tokens: 4 blocks).
    mixed = timing.prefill_ms(50) + timing.decode_ms(7 / 1000)
    assert times[3] - times[2] == pytest.approx(mixed / 1e3, rel=1e-9)
    assert times[4] - times[3] == pytest.approx(timing.decode_ms(3 / 1000) / 1e3, rel=1e-9)


async def test_max_tokens_stop_tokens_and_ignore_eos(make_mocker: Any) -> None:
    m = await make_mocker(block_size=4, num_gpu_blocks=64)
    full = await m.run("a", PROMPT[:10], 12, seed=7)
    assert (len(full.tokens), full.finish) == (12, "length")
    assert full.tokens == [mock_token(7, i, MockerConfig().vocab_size) for i in range(12)]
    # The client's stop id ends the request where it is sampled, even with ignore_eos.
    stop = full.tokens[5]
    cut = full.tokens.index(stop) + 1
    for ignore_eos in (False, True):
        stopped = await m.run("b", PROMPT[:10], 12, seed=7, user_stop_token_ids=[stop],
                              ignore_eos=ignore_eos)  # fmt: skip
        assert (stopped.tokens, stopped.finish) == (full.tokens[:cut], "stop")
    # End of sequence comes after the drawn length (docs/mocker.md), unless ignored.
    eos_id = MockerConfig().vocab_size - 1
    length = output_length(7, "geometric", MockerConfig().eos_mean_tokens)
    assert length is not None and length < 12
    ended = await m.run("e", PROMPT[:10], 12, seed=7, stop_token_ids=[eos_id])
    assert (ended.tokens, ended.finish) == ([*full.tokens[: length - 1], eos_id], "stop")
    ignored = await m.run("c", PROMPT[:10], 12, seed=7, stop_token_ids=[eos_id], ignore_eos=True)
    assert (ignored.tokens, ignored.finish) == (full.tokens, "length")
    other = await m.run("d", PROMPT[:10], 12)
    assert other.tokens != full.tokens  # seeded by request id
    assert all(0 <= t < MockerConfig().vocab_size for t in other.tokens)


async def test_abort_frees_blocks_for_reuse(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100)
    stream = m.engine.generate(GenerateRequest("a", PROMPT, 1000))
    first = await stream.__anext__()
    await stream.__anext__()
    assert m.engine.load_metrics().active_blocks == 7
    await m.engine.abort("a")
    rest = [c async for c in stream]
    assert [(c.token_ids, c.finish_reason) for c in rest] == [([], "abort")]
    assert first.cached_tokens == 0
    assert m.engine.load_metrics().active_blocks == 0
    assert (await m.run("b", PROMPT, 1)).cached == 96
    await m.engine.abort("a")  # already gone: ignored
    await m.engine.abort("nobody")


async def test_abort_waiting_request_and_aclose(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100, max_num_seqs=1)
    running = m.engine.generate(GenerateRequest("a", PROMPT, 50))
    waiting = m.engine.generate(GenerateRequest("b", PROMPT[:30], 50))
    await running.__anext__()
    metrics = m.engine.load_metrics()
    assert (metrics.num_running, metrics.num_waiting) == (1, 1)
    assert metrics.prefill_tokens_queued == 30
    await m.engine.abort("b")
    chunks = [c async for c in waiting]
    assert [(c.token_ids, c.finish_reason, c.prompt_tokens) for c in chunks] == [([], "abort", 30)]
    await running.aclose()
    assert m.engine.load_metrics().num_running == 0
    assert [c async for c in running] == []


def test_abort_during_a_step_frees_blocks_when_it_ends() -> None:
    sched = Scheduler(MockerConfig(block_size=4, num_gpu_blocks=10))
    sched.add(GenerateRequest("a", list(range(9)), 5))
    plan = sched.schedule()
    assert sched.pool.num_active == 3
    assert sched.abort("a")
    assert sched.pool.num_active == 3  # the step still computes into them
    assert sched.finish_step(plan) == []
    assert (sched.pool.num_active, sched.has_work()) == (0, False)


@pytest.mark.parametrize(
    ("options", "prompt", "max_tokens", "knob"),
    [
        ({"num_gpu_blocks": 4, "block_size": 4, "max_model_len": 99}, 10, 8, "num_gpu_blocks"),
        ({"max_model_len": 64}, 60, 5, "max_model_len"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 16}, 10, 8, "chunked"),
        ({}, 0, 5, "empty prompt"),
        ({}, 5, 0, "max_tokens"),
    ],
)
async def test_impossible_requests_fail_explicitly(
    make_mocker: Any, options: dict[str, Any], prompt: int, max_tokens: int, knob: str
) -> None:
    m = await make_mocker(**options)
    with pytest.raises(RequestRejected, match=knob):
        await m.run("x", list(range(prompt)), max_tokens)
    assert (await m.run("ok", [1, 2, 3], 2)).finish == "length"  # the engine is unharmed


async def test_duplicate_id_and_bad_tokens_rejected(make_mocker: Any) -> None:
    m = await make_mocker()
    stream = m.engine.generate(GenerateRequest("a", [1, 2], 3))
    with pytest.raises(RequestRejected, match="already in use"):
        await m.run("a", [1, 2], 3)
    with pytest.raises(RequestRejected, match="token ids"):
        await m.run("b", [-1], 3)
    assert len((await m.read(stream)).tokens) == 3


async def test_not_started_stopped_and_dead_engines() -> None:
    engine = MockerEngine(MockerConfig(num_gpu_blocks=100, block_size=4))
    with pytest.raises(EngineStopped):
        await engine.generate(GenerateRequest("a", [1], 1)).__anext__()

    def broken_sink(batch: object) -> None:
        raise ValueError("publisher broke")

    engine.set_kv_event_sink(broken_sink)
    await engine.start()
    with pytest.raises(EngineStopped) as info:
        async for _ in engine.generate(GenerateRequest("a", [1, 2, 3, 4, 5], 3)):
            pass
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(EngineStopped):
        await engine.generate(GenerateRequest("b", [1], 1)).__anext__()
    engine.set_kv_event_sink(None)
    await engine.start()  # restartable; the dead loop's requests are gone
    assert engine.load_metrics().active_blocks == 0
    stream = engine.generate(GenerateRequest("c", [1, 2, 3], 50))
    await stream.__anext__()
    await engine.stop()
    assert [c.finish_reason async for c in stream] == ["abort"]
    await engine.stop()


async def test_without_prefix_caching_nothing_is_cached_or_published(make_mocker: Any) -> None:
    m = await make_mocker(block_size=4, num_gpu_blocks=64, enable_prefix_caching=False)
    await m.run("a", PROMPT[:20], 3)
    assert (await m.run("b", PROMPT[:20], 3)).cached == 0
    assert m.batches == []


async def test_events_let_a_router_recompute_hashes(make_mocker: Any) -> None:
    m = await make_mocker(block_size=4, num_gpu_blocks=64, data_parallel_rank=2)
    await m.run("a", PROMPT[:22], 9)
    stored = [e for b in m.batches for e in b.events if isinstance(e, BlockStored)]
    assert {b.data_parallel_rank for b in m.batches} == {2}
    for event in stored:  # what the router does with token_ids and the parent hash
        assert not isinstance(event.parent_block_hash, bytes)
        assert hashing.sequence_hashes(event.token_ids, 4, event.parent_block_hash) == (
            event.block_hashes
        )
    assert sum(len(e.block_hashes) for e in stored) == (22 + 9 - 1) // 4


async def test_real_clock_runs_the_same_simulation() -> None:
    engine = MockerEngine(MockerConfig(num_gpu_blocks=100, block_size=16, speedup_ratio=1e4))
    assert isinstance(engine.clock, RealClock)
    await engine.start()
    tokens = [
        t async for c in engine.generate(GenerateRequest("a", PROMPT, 5)) for t in c.token_ids
    ]
    await engine.stop()
    assert len(tokens) == 5
    timing = engine.timing
    expected = timing.prefill_ms(100) + sum(timing.decode_ms(7 / 100) for _ in range(4))
    assert engine.stats.busy_s == pytest.approx(expected / 1e3)


def test_preempted_request_goes_back_to_the_front_and_recomputes() -> None:
    sched = Scheduler(MockerConfig(block_size=2, num_gpu_blocks=4))
    for rid, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6]), ("c", [7, 8, 9])):
        sched.add(GenerateRequest(rid, prompt, 4))
    for _ in range(2):  # a and b fill the pool (2 blocks each); c waits
        plan = sched.schedule()
        assert [(s.request_id, n) for s, n in plan.scheduled] in (
            [("a", 3), ("b", 3)],
            [("a", 1), ("b", 1)],
        )
        sched.finish_step(plan)
    plan = sched.schedule()  # a's 5th token needs a 3rd block: b, admitted last, yields
    assert ([s.request_id for s, _ in plan.scheduled], plan.num_preempted) == (["a"], 1)
    assert [s.request_id for s in sched.waiting] == ["b", "c"]
    assert sched.load_metrics().prefill_tokens_queued == 5 + 3  # b's prompt + output, c
    sched.finish_step(plan)
    sched.check_invariants()


async def test_idle_time_passes_without_steps(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=100)
    await m.run("a", PROMPT[:20], 1)
    steps, m0 = m.engine.stats.steps, m.clock.now()
    m.clock.advance(5.0)
    out = await m.run("b", [1] * 20, 1)
    assert out.times[0] == pytest.approx(m0 + 5.0 + m.engine.timing.prefill_ms(20) / 1e3)
    assert m.engine.stats.steps == steps + 1
