"""Long prompts are tokenised off the event loop: other streams keep moving meanwhile, and
the ids are the tokenizer's own."""

from __future__ import annotations

import asyncio
import random
import string
from typing import Any, cast

from dynamoctl.frontend.longtext import CACHED_CHARS, INLINE_CHARS, LongTextEncoder
from dynamoctl.frontend.models import ServedModel
from dynamoctl.tokenizer.loader import load_tokenizer

STEPS = 50
"""Steps of the short stream that must finish while the long text is tokenised."""


def _model() -> ServedModel:
    none = cast(Any, None)  # the encoder reads only the tokenizer
    return ServedModel("m", none, load_tokenizer("builtin"), none)


def _history(chars: int) -> str:
    turn = "user: tell me more about the history of the river and its bridges, please.\n"
    return (turn * (chars // len(turn) + 1))[:chars]


def _unseen(chars: int) -> str:
    """Text of words nobody has tokenised before (the word cache knows none of them)."""
    rng = random.Random(chars)
    words = (
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in iter(int, 1)
    )
    text = ""
    while len(text) < chars:
        text += " ".join(next(words) for _ in range(1000)) + ".\n"
    return text[:chars]


async def test_a_long_tokenisation_does_not_stall_a_concurrent_short_stream() -> None:
    model = _model()
    encoder = LongTextEncoder()
    text = _unseen(256 << 10)  # ~100k tokens: 100 ms or more of tokenising
    long = asyncio.ensure_future(encoder.encode(model, text, False, 1 << 30))
    steps: list[bool] = []  # per step of the short stream: was the long one still running
    while not long.done() and len(steps) < STEPS:
        ids = model.tokenizer.encode("a short prompt", add_special_tokens=False)  # inline
        assert ids
        await asyncio.sleep(0)
        steps.append(not long.done())
    assert steps == [True] * STEPS  # every step ran before the long text's ids came back
    ids = await long
    assert ids == model.tokenizer.encode(text, add_special_tokens=False)
    encoder.pool.shutdown()


async def test_texts_over_the_inline_limit_get_the_same_ids_or_their_count() -> None:
    model = _model()
    encoder = LongTextEncoder()
    text = _history(INLINE_CHARS * 3)
    whole = model.tokenizer.encode(text, add_special_tokens=False)
    assert await encoder.encode(model, text, False, len(whole) + 1) == whole
    assert await encoder.encode(model, text, False, len(whole)) == len(whole)  # refused: count
    encoder.pool.shutdown()


async def test_ordinary_long_texts_use_the_models_tokenizer_and_huge_ones_a_cacheless_copy() -> (
    None
):
    model = _model()
    encoder = LongTextEncoder()
    ordinary, huge = _history(CACHED_CHARS), _history(CACHED_CHARS + 1)
    assert await encoder.encode(model, ordinary, False, 1 << 30) == model.tokenizer.encode(
        ordinary, add_special_tokens=False
    )
    assert not encoder._copies  # no copy made: the model's own (word-cached) tokenizer
    assert await encoder.encode(model, huge, False, 1 << 30) == model.tokenizer.encode(
        huge, add_special_tokens=False
    )
    assert len(encoder._copies) == 1  # the huge text went through the cache-less copy
    encoder.pool.shutdown()
