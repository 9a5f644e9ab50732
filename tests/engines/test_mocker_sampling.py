"""The mocker samples like a model would be asked to (docs/mocker.md, "Sampling and end of
sequence"): it ends requests itself after a drawn length, honours min_tokens, the client's
stop ids and ignore_eos, and returns plausible log-probabilities."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker import MockerConfig
from dynamoctl.engines.mocker.sampling import (
    MockSampler,
    mock_token,
    output_length,
    prompt_logprobs,
    request_seed,
)

EOS = 8191
VOCAB = MockerConfig().vocab_size


def sampler(**fields: Any) -> MockSampler:
    request = GenerateRequest("r", [1, 2, 3], fields.pop("max_tokens", 1000), **fields)
    return MockSampler(request, VOCAB, "geometric", 32.0)


def test_output_lengths_follow_the_configured_distribution() -> None:
    geometric = [output_length(seed, "geometric", 32.0) for seed in range(4000)]
    lengths = [n for n in geometric if n is not None]
    assert len(lengths) == 4000 and min(lengths) == 2  # never an empty answer
    assert 29 < sum(lengths) / len(lengths) < 35  # mean 32
    at_most_32 = sum(n <= 32 for n in lengths) / len(lengths)
    assert at_most_32 == pytest.approx(1 - (30 / 31) ** 31, abs=0.03)
    uniform = [output_length(seed, "uniform", 32.0) or 0 for seed in range(4000)]
    assert min(uniform) == 2 and max(uniform) == 62 and 30 < sum(uniform) / 4000 < 34
    assert {output_length(s, "fixed", 32.0) for s in range(50)} == {32}
    assert output_length(1, "none", 32.0) is None


def test_a_request_ends_itself_with_its_eos_token_unless_told_not_to() -> None:
    ends = sampler(stop_token_ids=[EOS, 9000], seed=5)
    length = output_length(5, "geometric", 32.0)
    assert length is not None
    tokens = [ends.token(i) for i in range(length)]
    assert tokens[-1] == (EOS, True)  # the smallest end-of-sequence id
    assert not any(stop for _, stop in tokens[:-1])
    assert [t for t, _ in tokens[:-1]] == [mock_token(5, i, VOCAB) for i in range(length - 1)]
    for never in (sampler(stop_token_ids=[EOS], seed=5, ignore_eos=True), sampler(seed=5)):
        assert not any(never.token(i)[1] for i in range(500))


def test_min_tokens_holds_back_eos_and_stop_ids() -> None:
    seed = next(s for s in range(500) if output_length(s, "geometric", 32.0) == 2)
    eager = sampler(stop_token_ids=[EOS], seed=seed)
    assert eager.token(1) == (EOS, True)
    held = sampler(stop_token_ids=[EOS], seed=seed, min_tokens=6)
    assert [held.token(i)[1] for i in range(7)] == [False] * 6 + [True]
    # A client's stop id drawn before min_tokens is redrawn; after it, it stops.
    stop_id = mock_token(9, 2, VOCAB)
    early = sampler(seed=9, user_stop_token_ids=[stop_id], min_tokens=4, ignore_eos=True)
    token, stop = early.token(2)
    assert not stop and token != stop_id
    late = sampler(seed=9, user_stop_token_ids=[stop_id], ignore_eos=True)
    assert late.token(2) == (stop_id, True)  # even with ignore_eos, as vLLM


def test_a_scripted_answer_ends_where_its_script_ends() -> None:
    """A structured answer (docs/mocker.md) is not cut by the drawn length: it ends with its
    script's end-of-sequence; thinking alone is followed by sampled text with a drawn end."""
    seed = next(s for s in range(500) if output_length(s, "geometric", 32.0) == 2)
    answer = sampler(stop_token_ids=[EOS], seed=seed)
    answer.script = [100 + i for i in range(20)] + [EOS]
    tokens = [answer.token(i) for i in range(21)]
    assert tokens == [(100 + i, False) for i in range(20)] + [(EOS, True)]
    thinking = sampler(stop_token_ids=[EOS], seed=seed)
    thinking.script = [100, 101, 102]
    assert [thinking.token(i) for i in range(3)] == [(100, False), (101, False), (102, False)]
    assert thinking.token(3) == (mock_token(seed, 0, VOCAB), False)
    assert thinking.token(4) == (EOS, True)  # the drawn length, counted after the script


async def test_max_tokens_bounds_a_scripted_answer(make_mocker: Any) -> None:
    from dynamoctl.wire.structured import OutputConstraint, OutputSpec

    m = await make_mocker(block_size=16, num_gpu_blocks=200, eos_mean_tokens=2.0)
    schema = {"type": "object", "required": ["name", "tags"], "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "minItems": 3}}}  # fmt: skip
    spec = OutputSpec(constraint=OutputConstraint(json_schema=schema))
    cut = await m.run("cut", [1, 2, 3], 3, stop_token_ids=[EOS], output=spec)
    assert cut.finish == "length" and len(cut.tokens) == 3 and EOS not in cut.tokens
    whole = await m.run("whole", [1, 2, 3], 500, stop_token_ids=[EOS], output=spec)
    assert whole.finish == "stop" and whole.tokens[-1] == EOS and len(whole.tokens) > 8


def test_logprobs_are_plausible() -> None:
    s = sampler(seed=3, logprobs=5)
    for i in range(50):
        token, _ = s.token(i)
        lp = s.logprobs_of(token, i)
        assert lp.top_ids[0] == token and len(set(lp.top_ids)) == 5
        assert lp.top_logprobs[0] == lp.logprob and lp.logprob <= 0
        assert lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)
        assert sum(math.exp(p) for p in lp.top_logprobs) <= 1 + 1e-9
        assert lp == s.logprobs_of(token, i)  # deterministic
    only = sampler(seed=3, logprobs=0).logprobs_of(7, 0)
    assert only.top_ids == [] and only.logprob <= 0


def test_prompt_logprobs_are_plausible_and_follow_the_tokens() -> None:
    """Each prompt token after the first is scored from itself and the token before it:
    equal prompts score equally, the token sits at its rank, probabilities sum to <= 1."""
    ids = [mock_token(9, i, 1000) for i in range(200)]
    entries = prompt_logprobs(ids, 3, 1000)
    assert len(entries) == len(ids) and entries[0] is None
    ranks = []
    for token, lp in zip(ids[1:], entries[1:], strict=True):
        assert lp is not None and lp.rank is not None and lp.logprob <= 0
        assert lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)
        if lp.rank <= 3:
            assert lp.top_ids[lp.rank - 1] == token
            assert lp.top_logprobs[lp.rank - 1] == lp.logprob
        else:
            assert lp.logprob < lp.top_logprobs[-1]
        assert sum(math.exp(p) for p in lp.top_logprobs) <= 1 + 1e-9
        ranks.append(lp.rank)
    assert 0.4 < ranks.count(1) / len(ranks) < 0.8  # mostly the most likely, not always
    assert prompt_logprobs(ids[:50], 3, 1000) == entries[:50]  # a prefix scores the same
    assert prompt_logprobs([], 3, 1000) == []


async def test_the_engine_streams_eos_and_logprobs(make_mocker: Any) -> None:
    m = await make_mocker(block_size=16, num_gpu_blocks=200, eos_mean_tokens=8.0)
    seed = next(s for s in range(100) if (output_length(s, "geometric", 8.0) or 0) >= 4)
    out = await m.run("a", list(range(40)), 500, seed=seed, stop_token_ids=[EOS], logprobs=2)
    assert out.finish == "stop" and out.tokens[-1] == EOS
    assert len(out.tokens) == output_length(seed, "geometric", 8.0)
    entries = [lp for c in out.chunks for lp in (c.logprobs or [])]
    assert len(entries) == len(out.tokens)
    assert [e.top_ids[0] for e in entries] == out.tokens
    capped = await m.run("b", list(range(40)), 3, seed=seed, stop_token_ids=[EOS])
    assert capped.finish == "length" and len(capped.tokens) == 3
    exact = await m.run("c", list(range(40)), 60, seed=seed, stop_token_ids=[EOS], ignore_eos=True)
    assert exact.finish == "length" and len(exact.tokens) == 60 and exact.chunks[0].logprobs is None


def test_a_greedy_answer_is_a_function_of_its_prompt() -> None:
    def seed(rid: str, ids: list[int], **fields: Any) -> int:
        return request_seed(GenerateRequest(rid, ids, 10, **fields))

    assert seed("a", [1, 2, 3], temperature=0.0) == seed("b", [1, 2, 3], temperature=0.0)
    assert seed("a", [1, 2, 3], temperature=0.0) != seed("a", [1, 2, 4], temperature=0.0)
    assert seed("a", [1, 2, 3], temperature=0.7) != seed("b", [1, 2, 3], temperature=0.7)
    assert seed("a", [1, 2, 3]) != seed("b", [1, 2, 3])  # engine default: not greedy
    assert seed("a", [1], temperature=0.0, seed=5) == 5  # a seed wins
