"""Tokenizers for the tests: the shipped one, and model directories the tests build themselves.

``make_model_dir`` trains a tiny SentencePiece-style BPE (Llama 2's layout: "▁" for spaces,
byte fallback, a decoder that drops the first leading space) with a ChatML template. It
differs from the builtin byte-level BPE in exactly the ways that break naive streaming, and
it is built here, so the tests download nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer import Tokenizer, clear_cache, load_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming text must keep its spaces: hello there, general Kenobi.",
    "Numbers 1234 and punctuation!? are here too.",
] * 4


def sentencepiece_style(texts: list[str], vocab_size: int = 300) -> FastTokenizer:
    """A Llama-2-like tokenizer: Metaspace words, BPE with byte fallback, Strip decoder."""
    tok = FastTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # The trainer cannot add byte-fallback tokens <0x00>..<0xFF>: add them to the model's
    # vocabulary (not as added tokens, which decode would treat as text) and rebuild.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = json.loads(
        decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        ).__getstate__()
    )
    tok = FastTokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("</s>", "<|im_start|>")]
        + [AddedToken("<|im_end|>", special=True, normalized=False)]
    )
    return tok


MakeModelDir = Callable[..., Path]


@pytest.fixture
def make_model_dir(tmp_path: Path) -> Iterator[MakeModelDir]:
    """Write a model directory: ``make_model_dir(config={...}, files={name: text})``."""

    def make(
        name: str = "model",
        config: dict[str, Any] | None = None,
        files: dict[str, str] | None = None,
        backend: FastTokenizer | None = None,
    ) -> Path:
        root = tmp_path / name
        root.mkdir()
        (root / "tokenizer.json").write_text((backend or sentencepiece_style(TINY_CORPUS)).to_str())
        cfg = {"eos_token": "</s>", "chat_template": CHATML} if config is None else config
        (root / "tokenizer_config.json").write_text(json.dumps(cfg))
        for fname, text in (files or {}).items():
            (root / fname).parent.mkdir(parents=True, exist_ok=True)
            (root / fname).write_text(text)
        return root

    yield make
    clear_cache()  # directories under tmp_path are gone after the test


@pytest.fixture(scope="session")
def builtin() -> Tokenizer:
    return load_tokenizer("builtin")


@pytest.fixture(scope="session")
def sp_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The SentencePiece-style tokenizer, loaded through the loader (session-wide)."""
    root = tmp_path_factory.mktemp("sp")
    (root / "tokenizer.json").write_text(sentencepiece_style(TINY_CORPUS).to_str())
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return load_tokenizer(str(root))
