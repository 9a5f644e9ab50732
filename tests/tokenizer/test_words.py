"""The word cache gives exactly the tokenizer's ids: for the three pre-tokenizer regexes it
is declared for, on texts of every kind of whitespace, added token and script, cold and
warm, in pieces and from threads at once; and it is refused for tokenizers it is not
proven for."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, normalizers, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer import Tokenizer, pieces, words
from dynamoctl.tokenizer.words import PATTERNS, WordCache
from tests.tokenizer.conftest import TINY_CORPUS, sentencepiece_style

WORDS = [
    "the", "agent", "reads", "a", "tool", "call", "it's", "we'll", "DON'T", "naïve", "café",
    "e\u0301", "x²", "日本語", "Привет", "123", "45678", "x_y", "(see)", "--", "!?", "", "\n",
    "\n\n", "\r\n", "  ", "\t", "\u3000", "\xa0", "\x1c", "\u2028", "<|eot_id|>",
    "<|start_header_id|>", "é", "def f():\n", "    return", "a" * 80,
]  # fmt: skip
QWEN2 = next(p for p in PATTERNS if r"\p{N}|" in p)


@pytest.fixture(autouse=True)
def learn_from_short_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short texts through the cache whatever it knows: the tests' texts are short."""
    monkeypatch.setattr(words, "LEARN_FROM_WORDS", 0)
    monkeypatch.setattr(words, "MIN_CHARS", 0)


def _variant(builtin: Tokenizer, pre_tokenizer: object, normalizer: object = None) -> FastTokenizer:
    spec = json.loads(builtin.backend.to_str())
    spec["pre_tokenizer"] = pre_tokenizer
    spec["normalizer"] = normalizer
    return FastTokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def declared(builtin: Tokenizer) -> dict[str, FastTokenizer]:
    """The builtin (Llama 3's regex), and its vocabulary behind GPT-2's and Qwen2's."""
    qwen2 = json.loads(builtin.backend.pre_tokenizer.__getstate__())
    qwen2["pretokenizers"][0]["pattern"]["Regex"] = QWEN2
    gpt2 = json.loads(pre_tokenizers.ByteLevel(add_prefix_space=False).__getstate__())
    nfc = json.loads(normalizers.NFC().__getstate__())
    return {
        "llama3": FastTokenizer.from_str(builtin.backend.to_str()),
        "gpt2": _variant(builtin, gpt2),
        "qwen2": _variant(builtin, qwen2, nfc),
    }


def _whole(tokenizer: FastTokenizer, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids


@settings(max_examples=80, deadline=None)
@given(
    parts=st.lists(st.sampled_from(WORDS), min_size=1, max_size=300),
    glue=st.sampled_from([" ", "  ", " \n"]),
)
def test_the_cache_gives_the_whole_texts_ids_cold_and_warm(
    declared: dict[str, FastTokenizer], parts: list[str], glue: str
) -> None:
    text = " ".join(parts) + glue + " ".join(reversed(parts))
    for name, tokenizer in declared.items():
        cache = WordCache.of(tokenizer)
        assert cache is not None, name
        want = _whole(tokenizer, text)
        assert cache.encode(text) == want, (name, text)  # cold: every chunk new
        assert cache.encode(text) == want, (name, text)  # warm: every chunk known


@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.sampled_from(WORDS), min_size=1, max_size=100))
def test_every_cut_starts_a_pre_token_of_the_whole_text(
    declared: dict[str, FastTokenizer], parts: list[str]
) -> None:
    """What makes the ids equal, checked where it holds whatever the vocabulary merges."""
    text = " ".join(parts)
    split = text.split(" ")
    chunks = words._chunks(split, {w for w in split if not w or w[-1].isspace()})
    assert " ".join(chunks) == text
    cuts, at = set(), len(chunks[0])
    for chunk in chunks[1:]:
        cuts.add(at)
        at += 1 + len(chunk)
    for name, tokenizer in declared.items():
        starts = {start for _, (start, _) in tokenizer.pre_tokenizer.pre_tokenize_str(text)}
        assert cuts <= starts, (name, text)


def test_pieces_of_what_is_new_and_threads_at_once_give_the_same_ids(
    declared: dict[str, FastTokenizer],
) -> None:
    texts = [" ".join(WORDS[i:] + WORDS[:i]) * 30 for i in range(8)]
    for tokenizer in declared.values():
        cache = WordCache.of(tokenizer)
        assert cache is not None
        with pytest.MonkeyPatch.context() as mp:  # short pieces: many cuts
            mp.setattr(pieces, "MIN_PIECE_CHARS", 200)
            assert cache.encode(texts[0], most=5) == _whole(tokenizer, texts[0])
        got: dict[int, list[int]] = {}

        def encode(i: int, cache: WordCache = cache, got: dict[int, list[int]] = got) -> None:
            got[i] = cache.encode(texts[i])

        threads = [threading.Thread(target=encode, args=(i,)) for i in range(len(texts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == {i: _whole(tokenizer, t) for i, t in enumerate(texts)}


def test_chunks_join_by_an_added_token_the_text_lacks_or_the_text_is_encoded_whole(
    builtin: Tokenizer,
) -> None:
    cache = WordCache.of(builtin.backend)
    assert cache is not None
    added = [t.content for t in builtin.backend.get_added_tokens_decoder().values()]
    last = max(builtin.backend.get_added_tokens_decoder().items())[1].content
    # "file\n  and": a chunk after whitespace, joined to the others by an added token
    one = f"tell the agent {last} to read the file\n  and call the tool now please " * 4
    assert cache.encode(one) == _whole(builtin.backend, one)
    assert "file\n  and" in cache._known  # joined by another added token than the last
    plain = " ".join(added) + " so the words are these and spaces join them " * 4
    assert cache.encode(plain) == _whole(builtin.backend, plain)
    assert "join" in cache._known  # one-word chunks need no added token
    every = "so the words are these\n  " + "".join(added) + " and nothing joins them " * 4
    assert cache.encode(every) == _whole(builtin.backend, every)
    assert "joins" not in cache._known  # encoded whole: no chunk learnt


def test_a_full_cache_starts_over_with_the_last_texts_chunks(
    builtin: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(words, "MAX_WORDS", 40)
    monkeypatch.setattr(words, "MAX_CHARS", 1000)
    cache = WordCache.of(builtin.backend)
    assert cache is not None
    for n in range(6):  # 30 new chunks a text: full at the second
        text = " ".join(f"w{n}x{i}" for i in range(30)) + " and the rest"
        assert cache.encode(text) == _whole(builtin.backend, text)
        assert len(cache._known) <= 40 + 30
    assert "w0x0" not in cache._known and "w5x0" in cache._known  # started over since
    long = "the " + "y" * 2000 + " and the rest of it " * 5  # over the characters' bound
    assert cache.encode(long) == _whole(builtin.backend, long)
    assert "w5x0" not in cache._known and "rest" in cache._known
    assert cache._chars == sum(map(len, cache._known))


def _with(builtin: Tokenizer, **change: object) -> FastTokenizer:
    copy = FastTokenizer.from_str(builtin.backend.to_str())
    for name, value in change.items():
        if name == "added":
            copy.add_tokens([value])
        elif name == "truncation":
            copy.enable_truncation(max_length=64)
        else:
            setattr(copy, name, value)
    return copy


def test_tokenizers_the_cut_is_not_proven_for_get_no_cache(builtin: Tokenizer) -> None:
    spec = json.loads(builtin.backend.to_str())
    spec["model"]["dropout"] = 0.1
    dropout = FastTokenizer.from_str(json.dumps(spec))
    other_regex = json.loads(builtin.backend.pre_tokenizer.__getstate__())
    other_regex["pretokenizers"][0]["pattern"]["Regex"] = r"\S+\s*"
    refused = {
        "sentencepiece": sentencepiece_style(TINY_CORPUS),
        "added token with a space": _with(builtin, added=AddedToken("tool call")),
        "added token that strips": _with(builtin, added=AddedToken("<x>", rstrip=True)),
        "dropout": dropout,
        "other regex": _variant(builtin, other_regex),
        "lowercase": _with(builtin, normalizer=normalizers.Lowercase()),
        "truncates": _with(builtin, truncation=True),
    }
    assert {name: WordCache.of(t) for name, t in refused.items()} == dict.fromkeys(refused)
    assert WordCache.of(builtin.backend) is not None
    assert builtin.words is not None  # the loaded tokenizer encodes through its cache


def test_ids_that_do_not_cut_one_spaced_token_a_word_are_joined_the_other_way(
    builtin: Tokenizer,
) -> None:
    """The guard behind the cut at spaced tokens: if the tokens did not begin with one
    spaced token a word (they do, for the declared tokenizers), the chunks are joined by
    an added token instead of being cut wrong."""
    cache = WordCache.of(builtin.backend)
    assert cache is not None
    cache.encode("a first text of words to make the table of spaced tokens " * 4)
    assert cache._spaced is not None
    spaced = bytearray(cache._spaced)
    spaced[builtin.backend.token_to_id("z")] = 1  # as if "z" began with a space
    cache._spaced = bytes(spaced)
    text = "the zebra saw a xyzzy in the tree " * 8  # " xyzzy": ["Ġ", "xy", "z", "z", "y"]
    assert cache.encode(text) == _whole(builtin.backend, text)
    assert cache._known["xyzzy"] == _whole(builtin.backend, " xyzzy")


def test_a_short_text_goes_through_the_cache_only_once_most_of_its_words_are_known(
    builtin: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(words, "LEARN_FROM_WORDS", 1024)
    cache = WordCache.of(builtin.backend)
    assert cache is not None
    short = "the agent reads the file and then calls the tool with its output " * 4
    assert cache.encode(short) == _whole(builtin.backend, short)
    assert not cache._known  # mostly new and short: tokenised whole, nothing learnt
    long = "the agent reads the file and then calls the tool with its output " * 100
    assert cache.encode(long) == _whole(builtin.backend, long)
    assert "tool" in cache._known  # long enough to learn from
    again = short + " and a zebra"
    assert cache.encode(again) == _whole(builtin.backend, again)
    assert "zebra" in cache._known  # now known enough: through the cache, which learnt


def test_an_added_token_matched_across_a_join_leaves_the_text_encoded_whole(
    builtin: Tokenizer,
) -> None:
    """An added token that overlaps the separator's start could swallow it: the count of
    separators in the ids catches that, and the text is tokenised whole."""
    tokenizer = FastTokenizer.from_str(builtin.backend.to_str())
    separator = max(tokenizer.get_added_tokens_decoder().items())[1].content
    tokenizer.add_special_tokens([AddedToken("q" + separator[:3], normalized=False)])
    cache = WordCache.of(tokenizer)
    assert cache is not None
    cache._separators = [(separator, tokenizer.token_to_id(separator))]  # only that one
    # Every chunk ends in "q", so each join reads "q" + separator: the new token first.
    text = " ".join(f"w{i}q" for i in range(30)) + " vq\n  uq toolq"
    assert cache.encode(text) == _whole(tokenizer, text)
    assert "toolq" not in cache._known  # encoded whole
