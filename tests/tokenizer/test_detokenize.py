"""IncrementalDetokenizer: any split of the ids gives decode(all ids), never half a character."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.tokenizer import IncrementalDetokenizer, Tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table that byte-level BPE vocabularies are written in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    """One token per byte: the worst split a byte-level model can produce."""
    table = bytes_to_unicode()
    ids = [tok.token_to_id(table[b]) for b in data]
    assert None not in ids
    return [i for i in ids if i is not None]


def stream(
    tok: Tokenizer,
    ids: Sequence[int],
    cuts: Sequence[int],
    prompt: Sequence[int] = (),
    skip_special_tokens: bool = True,
) -> list[str]:
    """Chunks emitted when ``ids`` arrive split at ``cuts``, then the flush."""
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip_special_tokens)
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(ids)), len(ids)]
    out = [detok.push(ids[a:b]) for a, b in pairwise(bounds)]
    return [*out, detok.flush()]


def test_multibyte_characters_split_across_tokens(builtin: Tokenizer) -> None:
    text = "a中🙂é"
    ids = byte_ids(builtin, text.encode())
    chunks = stream(builtin, ids, range(len(ids)))
    # One push per byte: each character comes out whole, on its last byte.
    assert chunks == ["a", "", "", "中", "", "", "", "🙂", "", "é", ""]


def test_incomplete_character_at_the_end_is_flushed(builtin: Tokenizer) -> None:
    ids = byte_ids(builtin, "ok中".encode()[:-1])
    detok = IncrementalDetokenizer(builtin)
    assert detok.push(ids) == "ok"
    assert detok.flush() == "\ufffd"  # what decode(all) gives: nothing more will come
    assert detok.flush() == ""


def test_invalid_bytes_do_not_stall_the_stream(builtin: Tokenizer) -> None:
    ids = byte_ids(builtin, b"\xe4x\xffy")
    assert "".join(stream(builtin, ids, range(len(ids)))) == builtin.decode(ids) == "\ufffdx\ufffdy"


@settings(max_examples=200)
@given(text=st.text(), data=st.data())
def test_any_split_of_valid_text(builtin: Tokenizer, text: str, data: st.DataObject) -> None:
    ids = builtin.encode(text, add_special_tokens=False)
    cuts = data.draw(st.lists(st.integers(0, max(len(ids), 1))))
    # Kept special tokens: special token text in the input ("<|eot_id|>") comes back too.
    chunks = stream(builtin, ids, cuts, skip_special_tokens=False)
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks) or "\ufffd" in text
    assert "".join(stream(builtin, ids, cuts)) == builtin.decode(ids)


@settings(max_examples=200)
@given(text=st.text(min_size=1), data=st.data())
def test_byte_per_token_split(builtin: Tokenizer, text: str, data: st.DataObject) -> None:
    ids = byte_ids(builtin, text.encode())
    cuts = data.draw(st.lists(st.integers(0, len(ids))))
    chunks = stream(builtin, ids, cuts)
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks) or "\ufffd" in text


@settings(max_examples=200)
@given(data=st.data(), skip=st.booleans())
def test_random_ids_give_decode_of_all(builtin: Tokenizer, data: st.DataObject, skip: bool) -> None:
    # What the mocker produces: arbitrary ids, special tokens and broken UTF-8 included.
    ids = data.draw(st.lists(st.integers(0, builtin.vocab_size - 1), max_size=40))
    cuts = data.draw(st.lists(st.integers(0, len(ids))))
    expected = builtin.decode(ids, skip_special_tokens=skip)
    assert "".join(stream(builtin, ids, cuts, skip_special_tokens=skip)) == expected


@settings(max_examples=100)
@given(prompt=st.text(), output=st.text(), data=st.data())
def test_prompt_context(builtin: Tokenizer, prompt: str, output: str, data: st.DataObject) -> None:
    prompt_ids = builtin.encode(prompt)
    ids = builtin.encode(output, add_special_tokens=False)
    cuts = data.draw(st.lists(st.integers(0, len(ids))))
    chunks = stream(builtin, ids, cuts, prompt=prompt_ids, skip_special_tokens=False)
    assert "".join(chunks) == output


def test_special_tokens(builtin: Tokenizer) -> None:
    ids = builtin.encode("Hi<|eot_id|>", add_special_tokens=True)
    assert "".join(stream(builtin, ids, range(len(ids)))) == "Hi"
    kept = "".join(stream(builtin, ids, range(len(ids)), skip_special_tokens=False))
    assert kept == "<|begin_of_text|>Hi<|eot_id|>"


# --- a SentencePiece-style tokenizer: spaces depend on context, one U+FFFD per byte ------


@pytest.mark.parametrize("text", ["Hello world, general Kenobi.", " two  spaces", "中🙂 x"])
def test_sentencepiece_spacing_one_token_at_a_time(sp_tokenizer: Tokenizer, text: str) -> None:
    ids = sp_tokenizer.encode(text, add_special_tokens=False)
    # Decoding tokens one by one would lose the spaces ("▁world" alone decodes to "world").
    assert "".join(sp_tokenizer.decode([i]) for i in ids) != sp_tokenizer.decode(ids)
    chunks = stream(sp_tokenizer, ids, range(len(ids)))
    assert "".join(chunks) == sp_tokenizer.decode(ids)
    assert not any("\ufffd" in c for c in chunks)


@settings(max_examples=100)
@given(prompt=st.text(), output=st.text(), data=st.data())
def test_sentencepiece_any_split(
    sp_tokenizer: Tokenizer, prompt: str, output: str, data: st.DataObject
) -> None:
    prompt_ids = sp_tokenizer.encode(prompt, add_special_tokens=False)
    ids = sp_tokenizer.encode(output, add_special_tokens=False)
    cuts = data.draw(st.lists(st.integers(0, len(ids))))
    full = sp_tokenizer.decode(prompt_ids + ids)
    # With the prompt as context, the output continues the prompt's text exactly.
    context = sp_tokenizer.decode(prompt_ids)
    if full.startswith(context):
        assert "".join(stream(sp_tokenizer, ids, cuts, prompt=prompt_ids)) == full[len(context) :]
    assert "".join(stream(sp_tokenizer, ids, cuts)) == sp_tokenizer.decode(ids)
