"""Chunks that arrive together are joined (docs/api.md, "Streaming"): one detokenise and
one text delta for a run of plain token chunks, the same text and outcome as one by one;
chunks with log-probabilities, a request with stop strings and a worker's abort stay apart."""

from __future__ import annotations

from typing import Any

from dynamoctl import wire
from dynamoctl.frontend.generate import Job, Outcome, _TokenStream
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.tokenizer import load_tokenizer
from dynamoctl.wire.engine import FinishReason, GenerateChunk, GenerateRequest, TokenLogprobs

TOKENIZER = load_tokenizer("builtin")
IDS = TOKENIZER.encode("The quick brown fox jumps over the lazy dog, twice or thrice.")


def token_stream(stop: list[str] | None = None) -> _TokenStream:
    engine = GenerateRequest("r", [1, 2, 3], max_tokens=64)
    job = Job("r", "m", engine, stop=stop or [])
    # The picker is told of the first token only; these streams start past it.
    picker: Any = None
    tokens = _TokenStream(job, TOKENIZER, picker, FrontendMetrics(), Outcome())
    tokens.last_token_at = tokens.started
    return tokens


def raw(chunks: list[GenerateChunk]) -> list[bytes]:
    return [wire.engine.encode(c) for c in chunks]


def one_per_token(finish: FinishReason | None = "length") -> list[GenerateChunk]:
    chunks = [GenerateChunk([t]) for t in IDS]
    chunks[0].cached_tokens, chunks[0].prompt_tokens = 2, 3
    chunks[-1].finish_reason = finish
    return chunks


def test_a_run_of_plain_chunks_is_one_chunk_with_the_same_text_and_outcome() -> None:
    chunks = one_per_token()
    joined = token_stream()
    run = joined.joined(raw(chunks))
    assert len(run) == 1
    assert run[0].token_ids == IDS
    assert (run[0].cached_tokens, run[0].prompt_tokens, run[0].finish_reason) == (2, 3, "length")
    apart = token_stream()
    text_apart = "".join(apart.push(c) for c in chunks)
    assert joined.push(run[0]) == text_apart
    assert joined.generated == apart.generated == IDS
    assert joined.outcome.finish_reason == apart.outcome.finish_reason == "length"


def test_a_request_with_stop_strings_keeps_its_chunks_apart() -> None:
    # Tokens past a stop string must not count as generated.
    chunks = one_per_token()
    assert len(token_stream(stop=["fox"]).joined(raw(chunks))) == len(chunks)


def test_chunks_with_logprobs_stay_apart() -> None:
    chunks = one_per_token()
    for c in chunks:
        c.logprobs = [TokenLogprobs(-0.5)]
    run = token_stream().joined(raw(chunks))
    assert [c.token_ids for c in run] == [[t] for t in IDS]


def test_an_abort_at_the_end_of_a_run_stays_last_and_alone() -> None:
    chunks = [*one_per_token(finish=None)[:3], GenerateChunk([], "abort")]
    run = token_stream().joined(raw(chunks))
    assert [c.token_ids for c in run] == [IDS[:3], []]
    assert [c.finish_reason for c in run] == [None, "abort"]


def test_one_chunk_is_passed_through() -> None:
    chunk = GenerateChunk(IDS[:2], cached_tokens=5)
    assert token_stream().joined(raw([chunk])) == [chunk]
