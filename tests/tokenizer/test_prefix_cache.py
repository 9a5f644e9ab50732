"""The chat prompts' prefix cache gives exactly the ids a whole tokenisation gives, turn
after turn, with both test tokenizers (byte-level BPE with a Llama-3 template, and the
SentencePiece-style one with ChatML, where no cut is safe and the cache stays unused),
and reuses earlier turns."""

from __future__ import annotations

import random

import pytest

from dynamoctl.tokenizer import Tokenizer, load_tokenizer
from dynamoctl.tokenizer.prefix import PrefixCache
from tests.tokenizer.conftest import MakeModelDir

WORDS = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "calls",
    "tool,",
    "waits:",
    "123",
    "héllo",
    "",
    "x\n",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _turns(tokenizer: Tokenizer, seed: int, turns: int = 5) -> list[str]:
    """Each turn's rendered prompt: the history, the answer, new user text."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": _text(rng, 50)},
                {"role": "user", "content": _text(rng, 1500)}]  # fmt: skip
    prompts = []
    for _ in range(turns):
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        messages.append({"role": "assistant", "content": _text(rng, 40)})
        messages.append({"role": "user", "content": _text(rng, 30)})
    return prompts


def _encode(
    cache: PrefixCache, tokenizer: Tokenizer, prompt: str, incremental: bool = True
) -> list[int]:
    """As the frontend does: the cached prefix's ids, then the rest's."""
    ids, rest = cache.split(prompt)
    ids.fromlist(tokenizer.encode(rest, add_special_tokens=False))
    cache.remember(prompt, ids, len(prompt) - len(rest) if incremental else 0)
    return ids.tolist()


@pytest.mark.parametrize("which", ["builtin", "sentencepiece"])
def test_prefix_cache_gives_the_whole_tokenisation(
    which: str, builtin: Tokenizer, make_model_dir: MakeModelDir
) -> None:
    tokenizer = builtin if which == "builtin" else load_tokenizer(str(make_model_dir()))
    cache = PrefixCache(tokenizer)
    for seed in (1, 2):  # two conversations, interleaved turn by turn below
        prompts = _turns(tokenizer, seed)
        for prompt in prompts:
            assert _encode(cache, tokenizer, prompt) == tokenizer.encode(
                prompt, add_special_tokens=False
            )
    # Every turn after each conversation's first; none where a cut does not split the
    # text (this SentencePiece-style pre-tokenizer marks only the input's first word).
    assert cache.hits == (8 if which == "builtin" else 0)


def test_special_token_text_in_user_content(builtin: Tokenizer) -> None:
    """A user who types a special token's text gets what a whole tokenisation gives."""
    cache = PrefixCache(builtin)
    prompts = _turns(builtin, 3, turns=2)
    _encode(cache, builtin, prompts[0])
    tricky = prompts[1].replace("calls", "<|eot_id|>calls<|start_header_id|>", 3)
    assert _encode(cache, builtin, tricky) == builtin.encode(tricky, add_special_tokens=False)


def test_bounded_by_tokens(builtin: Tokenizer) -> None:
    first = [_turns(builtin, seed, turns=1)[0] for seed in range(6)]
    size = max(len(builtin.encode(p, add_special_tokens=False)) for p in first)
    cache = PrefixCache(builtin, max_tokens=size * 4)  # room for four entries
    for prompt in first:
        _encode(cache, builtin, prompt)
    assert 0 < cache._tokens <= cache.max_tokens
    assert len(cache._entries) == 4  # the oldest went as new ones came
    assert cache.split(first[0])[1] == first[0]
    assert cache.split(first[-1])[1] != first[-1]


def test_one_huge_prompt_is_not_kept(builtin: Tokenizer) -> None:
    prompt = _turns(builtin, 7, turns=1)[0]
    size = len(builtin.encode(prompt, add_special_tokens=False))
    cache = PrefixCache(builtin, max_tokens=size * 3)  # one entry may be a quarter of it
    _encode(cache, builtin, prompt)
    assert not cache._entries


def test_counting_only_the_new_part_keeps_what_counting_all_keeps(builtin: Tokenizer) -> None:
    """``remember`` told which prefix it reused counts special tokens only after it, and
    keeps the same entries as when it counts the whole prompt (a user's special-token
    text included, which makes some prefixes unfit)."""
    caches = {True: PrefixCache(builtin), False: PrefixCache(builtin)}
    for seed in (4, 5):
        for turn, prompt in enumerate(_turns(builtin, seed, turns=6)):
            if turn == 3:
                prompt = prompt.replace("agent", "<|eot_id|>agent", 1)
            for incremental, cache in caches.items():
                ids = _encode(cache, builtin, prompt, incremental)
                assert ids == builtin.encode(prompt, add_special_tokens=False)
    assert caches[True]._entries == caches[False]._entries
    assert caches[True].hits == caches[False].hits > 0


def test_default_size_keeps_sixteen_long_conversations(builtin: Tokenizer) -> None:
    """16 agents with 32k-token histories turning in round robin all reuse their previous
    turn (a cache of 2^19 ids held 15 such prefixes and missed every time)."""
    rng = random.Random(8)
    conversations = [
        [{"role": "user", "content": f"agent {i}: " + _text(rng, 24_000)}] for i in range(16)
    ]
    cache = PrefixCache(builtin)
    for messages in conversations:
        prompt = builtin.apply_chat_template(messages, add_generation_prompt=True)
        assert len(_encode(cache, builtin, prompt)) > 32_000
    for messages in conversations:
        messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "go"}]
        prompt = builtin.apply_chat_template(messages, add_generation_prompt=True)
        assert cache.split(prompt)[0], "the previous turn's prefix was evicted"
        _encode(cache, builtin, prompt)
    assert cache.hits == 32  # the checks' splits and the turns' own
