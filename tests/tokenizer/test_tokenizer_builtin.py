"""The tokenizer shipped as package data: present, loadable, lossless, reproducible."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.tokenizer import Tokenizer, load_tokenizer
from dynamoctl.tokenizer import build_builtin as build
from dynamoctl.tokenizer._corpus import pseudo_sentences

SHIPPED = ("tokenizer.json", "tokenizer_config.json", "config.json")


def _shipped(name: str) -> str:
    return resources.files("dynamoctl.tokenizer").joinpath("builtin", name).read_text("utf-8")


def test_files_are_package_data_and_small() -> None:
    for name in SHIPPED:
        assert len(_shipped(name).encode()) < 1_000_000, name


def test_loads_from_package_data(builtin: Tokenizer) -> None:
    spec = json.loads(_shipped("tokenizer.json"))
    config = json.loads(_shipped("config.json"))
    assert builtin.source == "builtin"
    assert builtin.vocab_size == config["vocab_size"] == build.VOCAB_SIZE
    assert spec["model"]["type"] == "BPE"
    assert spec["decoder"]["type"] == "ByteLevel"
    assert load_tokenizer("builtin") is load_tokenizer("builtin")  # cached


def test_special_tokens_and_eos(builtin: Tokenizer) -> None:
    ids = {t: builtin.token_to_id(t) for t in build.SPECIAL_TOKENS}
    assert sorted(ids.values()) == list(range(build.VOCAB_SIZE - 5, build.VOCAB_SIZE))
    assert builtin.bos_token == "<|begin_of_text|>"
    assert builtin.eos_token == "<|end_of_text|>"
    assert builtin.eos_token_ids == {ids["<|end_of_text|>"], ids["<|eot_id|>"]}
    assert builtin.special_token_ids == set(ids.values())
    # encode() adds BOS only when asked, as Llama 3 does.
    assert builtin.encode("hi")[0] == builtin.bos_token_id
    assert builtin.bos_token_id not in builtin.encode("hi", add_special_tokens=False)
    # Special token text in input becomes the special token (as in transformers).
    assert builtin.encode("a<|eot_id|>", add_special_tokens=False)[-1] == ids["<|eot_id|>"]


def test_all_bytes_are_in_the_vocabulary(builtin: Tokenizer) -> None:
    # Byte-level: ids 0..255 are the 256 single bytes, so nothing is ever unknown.
    spec = json.loads(_shipped("tokenizer.json"))
    assert sorted(spec["model"]["vocab"].values())[:256] == list(range(256))


@pytest.mark.parametrize(
    "text",
    ["", " ", "  leading", "héllo wörld", "中文字符和标点。", "日本語のテキスト", "🙂👨‍👩‍👧‍👦🏳️‍🌈",
     "tab\tnew\nline\r\n", "\x00\x7f\u200b\ufeff", "\ufffd is valid text", "x" * 5000],
)  # fmt: skip
def test_round_trip_examples(builtin: Tokenizer, text: str) -> None:
    assert builtin.decode(builtin.encode(text, add_special_tokens=False)) == text
    assert builtin.decode(builtin.encode(text)) == text  # BOS is special: skipped


@settings(max_examples=300)
@given(text=st.text())
def test_round_trip_any_text(builtin: Tokenizer, text: str) -> None:
    # Kept special tokens: special token text in the input ("<|eot_id|>") comes back too.
    ids = builtin.encode(text, add_special_tokens=False)
    assert builtin.decode(ids, skip_special_tokens=False) == text


def test_english_is_not_spelled_out(builtin: Tokenizer) -> None:
    # A sanity bound, not a quality target: trained merges, not one token per byte.
    text = "Please summarize the following article in three sentences and keep the names."
    assert len(builtin.encode(text, add_special_tokens=False)) < len(text) / 3


def test_build_is_deterministic() -> None:
    corpus = list(pseudo_sentences(300))
    first = build.build_files(corpus, vocab_size=600)
    assert first == build.build_files(corpus, vocab_size=600)
    assert json.loads(first["config.json"])["vocab_size"] == 600


def test_corpus_is_fixed() -> None:
    # The generator must not depend on the Python version (no random, no floats).
    assert list(pseudo_sentences(2, seed=7)) == list(pseudo_sentences(2, seed=7))
    assert list(pseudo_sentences(1, seed=1)) != list(pseudo_sentences(1, seed=2))


def test_shipped_files_are_up_to_date() -> None:
    recorded = json.loads(_shipped("tokenizer_config.json"))["dynamoctl_build"]["tokenizers"]
    if recorded != build.built_with():
        pytest.skip(f"shipped files were built with tokenizers {recorded}, not this version")
    stale = build.stale_files(build.build_files(), build.OUT_DIR)
    assert not stale, (
        f"the shipped builtin tokenizer differs from a fresh build ({', '.join(stale)}): "
        "rebuild it with `python -m dynamoctl.tokenizer.build_builtin` and commit the files"
    )
