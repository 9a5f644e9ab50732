"""A long text cut into pieces tokenises, piece by piece, to exactly the ids of the whole
text: with the builtin byte-level BPE, a SentencePiece-style tokenizer, one with an added
token that contains a space, and one whose normaliser marks the input's start (never cut)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, normalizers
from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer import Tokenizer, pieces
from tests.tokenizer.conftest import TINY_CORPUS, sentencepiece_style

WORDS = [
    "the", "agent", "reads", "a", "tool", "call", "it's", "we'll", "naïve", "café",
    "日本語", "テキスト", "Привет", "123", "4567", "x_y", "(see)", "--", "!?", "",
    "\n", "\n\n", "  ", "\t", "<|eot_id|>", "<|start_header_id|>", "é",
]  # fmt: skip


def _with_spaced_token(builtin: Tokenizer) -> FastTokenizer:
    """The builtin with an added token that holds a cut's space ("tool call")."""
    copy = FastTokenizer.from_str(builtin.backend.to_str())
    copy.add_tokens([AddedToken("tool call", normalized=False)])
    return copy


def _marking_start() -> FastTokenizer:
    """A Llama-2-like normaliser: ``▁`` before the input and for every space."""
    tok = sentencepiece_style(TINY_CORPUS)
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = None
    spec["normalizer"] = json.loads(
        normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        .__getstate__()
    )  # fmt: skip
    return FastTokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def tokenizers(builtin: Tokenizer) -> dict[str, FastTokenizer]:
    return {
        "builtin": builtin.backend,
        "sentencepiece": sentencepiece_style(TINY_CORPUS),
        "spaced added token": _with_spaced_token(builtin),
        "marks the start": _marking_start(),
    }


def _ids(tokenizer: FastTokenizer, parts: list[str]) -> list[int]:
    return [i for e in tokenizer.encode_batch_fast(parts, add_special_tokens=False) for i in e.ids]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=20, max_size=400), most=st.integers(2, 9))
def test_pieces_give_the_whole_texts_ids(
    tokenizers: dict[str, FastTokenizer], words: list[str], most: int
) -> None:
    text = " ".join(words)
    with pytest.MonkeyPatch.context() as mp:  # short pieces: many cuts in a short text
        mp.setattr(pieces, "MIN_PIECE_CHARS", 40)
        mp.setattr(pieces, "WINDOW_CHARS", 64)
        for name, tokenizer in tokenizers.items():
            parts = pieces.pieces(tokenizer, text, most)
            assert "".join(parts) == text
            whole = tokenizer.encode(text, add_special_tokens=False).ids
            assert _ids(tokenizer, parts) == whole, (name, parts)


def test_an_agents_history_is_cut_as_asked_except_where_the_start_is_marked(
    tokenizers: dict[str, FastTokenizer],
) -> None:
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS[:12]) for _ in range(40_000))  # ~230 KB
    cut = {name: pieces.pieces(tok, text, 4) for name, tok in tokenizers.items()}
    assert len(cut["builtin"]) == 4 and len(cut["sentencepiece"]) == 4
    # "tool call" is one token: cuts inside it fail their window check, others hold.
    assert 1 <= len(cut["spaced added token"]) <= 4
    assert cut["marks the start"] == [text]  # the probes fail: never cut
    assert not pieces.cuttable(tokenizers["marks the start"])
    for name, parts in cut.items():
        tokenizer = tokenizers[name]
        assert _ids(tokenizer, parts) == tokenizer.encode(text, add_special_tokens=False).ids


def test_a_tokenizer_that_pads_or_truncates_is_never_cut(builtin: Tokenizer) -> None:
    padded = FastTokenizer.from_str(builtin.backend.to_str())
    padded.enable_padding()  # a batch padded to its longest: pieces would get pad ids
    truncated = FastTokenizer.from_str(builtin.backend.to_str())
    truncated.enable_truncation(max_length=1 << 20)
    text = "the agent reads a file " * 10_000
    for tokenizer in (padded, truncated):
        assert not pieces.cuttable(tokenizer)
        assert pieces.pieces(tokenizer, text, 4) == [text]


def test_short_texts_and_one_core_stay_whole(tokenizers: dict[str, FastTokenizer]) -> None:
    text = "word " * (pieces.MIN_PIECE_CHARS // 5)
    assert pieces.pieces(tokenizers["builtin"], text, 8) == [text]  # under two pieces' length
    assert pieces.pieces(tokenizers["builtin"], text * 4, 1) == [text * 4]


def test_a_cut_inside_an_added_token_is_refused_by_its_window(
    tokenizers: dict[str, FastTokenizer],
) -> None:
    tokenizer = tokenizers["spaced added token"]
    assert pieces.cuttable(tokenizer)  # the probes pass: only the window can catch it
    text = "tool call." * 30_000  # every space between letters is inside "tool call"
    assert pieces.pieces(tokenizer, text, 4) == [text]
