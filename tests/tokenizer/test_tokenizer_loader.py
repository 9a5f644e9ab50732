"""load_tokenizer: local directories in the transformers layout; never a download."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamoctl.tokenizer import (
    BUILTIN,
    TokenizerError,
    TokenizerNotFound,
    clear_cache,
    load_tokenizer,
)
from tests.tokenizer.conftest import MakeModelDir


def test_directory_tokenizer_trained_here_loads(make_model_dir: MakeModelDir) -> None:
    root = make_model_dir()
    tok = load_tokenizer(str(root))
    assert tok.source == str(root.resolve())
    text = "Hello world, general Kenobi 中 🙂"
    assert tok.decode(tok.encode(text)) == text  # byte fallback covers unseen characters
    assert tok.eos_token == "</s>"
    # </s> from the config and <|im_end|> as a known end-of-turn token.
    assert tok.eos_token_ids == {tok.token_to_id("</s>"), tok.token_to_id("<|im_end|>")}
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_loads_are_cached_per_resolved_directory(
    make_model_dir: MakeModelDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_model_dir()
    first = load_tokenizer(str(root))
    monkeypatch.chdir(root.parent)
    assert load_tokenizer(f"./{root.name}") is first
    assert load_tokenizer(f"{root}/") is first
    clear_cache()
    assert load_tokenizer(str(root)) is not first
    assert load_tokenizer(BUILTIN) is load_tokenizer("builtin")


@pytest.mark.parametrize("source", ["meta-llama/X", "meta-llama/Llama-3.1-8B-Instruct", "gpt2"])
def test_hub_id_is_refused_clearly(source: str) -> None:
    with pytest.raises(TokenizerNotFound) as info:
        load_tokenizer(source)
    assert str(info.value) == (
        f"tokenizer source '{source}' is not a local directory; dynamoctl never downloads: "
        "point model.tokenizer at a directory with tokenizer.json"
    )


def test_other_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFound, match=r"empty: set model\.tokenizer"):
        load_tokenizer("")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerNotFound, match=r"is a file: point model\.tokenizer at the dir"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerNotFound, match="not a local directory"):
        load_tokenizer(str(tmp_path / "missing"))


def test_directory_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFound, match=r"has no tokenizer.json$"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(TokenizerNotFound, match=r"tokenizer.model, a slow tokenizer: convert"):
        load_tokenizer(str(tmp_path))


def test_corrupt_files(make_model_dir: MakeModelDir) -> None:
    root = make_model_dir("a")
    (root / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerError, match=r"tokenizer.json is not a valid tokenizer"):
        load_tokenizer(str(root))
    root = make_model_dir("b")
    (root / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json is not valid JSON"):
        load_tokenizer(str(root))


def test_minimal_directory_has_no_specials(make_model_dir: MakeModelDir) -> None:
    root = make_model_dir(config={})
    (root / "tokenizer_config.json").unlink()
    tok = load_tokenizer(str(root))
    assert tok.bos_token is None and tok.eos_token is None and tok.chat_template is None
    assert tok.eos_token_ids == {tok.token_to_id("<|im_end|>")}


def test_eos_ids_from_generation_config(make_model_dir: MakeModelDir) -> None:
    root = make_model_dir(
        config={"bos_token": {"content": "<|im_start|>", "lstrip": False}, "eos_token": None},
        files={
            "generation_config.json": json.dumps({"eos_token_id": [7, 9]}),
            "config.json": json.dumps({"eos_token_id": 11}),  # generation config wins
        },
    )
    tok = load_tokenizer(str(root))
    assert tok.bos_token == "<|im_start|>" and tok.eos_token is None
    assert tok.eos_token_ids == {7, 9, tok.token_to_id("<|im_end|>")}


def test_added_tokens_decoder_adds_missing_tokens(make_model_dir: MakeModelDir) -> None:
    size = load_tokenizer(str(make_model_dir("plain"))).vocab_size
    declared = {
        str(size): {"content": "<tool>", "special": True},
        str(size + 1): {"content": "kenobi!", "special": False},
    }
    tok = load_tokenizer(str(make_model_dir(config={"added_tokens_decoder": declared})))
    assert tok.vocab_size == size + 2
    assert tok.token_to_id("<tool>") == size and tok.token_to_id("kenobi!") == size + 1
    assert size in tok.special_token_ids and size + 1 not in tok.special_token_ids
    assert tok.decode(tok.encode("a <tool> b")) == "a  b"  # special: skipped


def test_added_token_with_impossible_id(make_model_dir: MakeModelDir) -> None:
    declared = {"100000": {"content": "<far>", "special": True}}
    with pytest.raises(TokenizerError, match=r"declares token '<far>' with id 100000"):
        load_tokenizer(str(make_model_dir(config={"added_tokens_decoder": declared})))
