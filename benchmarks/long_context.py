"""The long-context request path's pieces, timed in-process by thread CPU (so a loaded
machine inflates them less than wall time): per turn of an agent's conversation, the
router's block hashing fresh vs with the hash cache (``dynamoctl/kv/hash_cache.py``),
what a 1 MB chat body costs the event loop before tokenisation (parsing and validation,
the chat template), and the tokenisation of dynamo_compare.py's multiturn conversations
(benchmarks/agentic.py): a first turn's 32k-token prompt on the long-text threads with
the call they make (the model's tokenizer, its BPE word cache warm), with the cache-less
copy they keep for huge texts, and with ``encode_batch`` (the call before), by process CPU (the
tokenizer may run it on its own threads), and the prefix cache's work on a later turn
(finding the prefix and joining its ids to the new text's; keeping the new prefix).

    python benchmarks/long_context.py [--turns 8] [--repeat 5] [--out FILE]

Each figure is the minimum over ``--repeat`` runs (the least disturbed by other work).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

import agentic

from dynamoctl.frontend.body import decode_body
from dynamoctl.frontend.longtext import LongTextEncoder
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.kv.hash_cache import HashCache
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.tokenizer.loader import load_tokenizer
from dynamoctl.tokenizer.prefix import PrefixCache
from dynamoctl.tokenizer.tokenizer import Tokenizer

HISTORY, NEW, BLOCK = 32_000, 400, 16
"""Tokens a conversation starts with, new tokens a turn (user text and the answer), and
the block size (dynamo_compare.py's)."""


def cpu_ms(
    fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.thread_time
) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return round(best * 1e3, 3)


def hashing(turns: int, repeat: int) -> dict[str, float]:
    rng = random.Random(1)
    prompts = [[rng.randrange(150_000) for _ in range(HISTORY)]]
    for _ in range(turns - 1):
        prompts.append(prompts[-1] + [rng.randrange(150_000) for _ in range(NEW)])
    fresh = [cpu_ms(lambda p=p: sequence_hashes(p, BLOCK), repeat) for p in prompts[1:]]
    cached = []
    for _ in range(repeat):
        cache = HashCache(BLOCK)
        cache.sequence_hashes(prompts[0])
        cached.append([cpu_ms(lambda p=p, c=cache: c.sequence_hashes(p), 1) for p in prompts[1:]])
    later = [min(col) for col in zip(*cached, strict=True)]
    return {
        "turns": turns,
        "fresh_ms_per_later_turn": round(sum(fresh) / len(fresh), 3),
        "cached_ms_per_later_turn": round(sum(later) / len(later), 3),
        "ratio": round(sum(later) / sum(fresh), 3),
    }


def big_body(repeat: int) -> dict[str, float]:
    messages = [{"role": ("user", "assistant")[i % 2], "content": "word " * 2000}
                for i in range(100)]  # fmt: skip
    raw = json.dumps({"model": "m", "messages": messages, "stream": True}).encode()
    tokenizer = load_tokenizer("builtin")
    return {
        "body_bytes": len(raw),
        "parse_ms": cpu_ms(lambda: decode_body(raw, ChatCompletionRequest), repeat),
        "template_ms": cpu_ms(
            lambda: tokenizer.apply_chat_template(messages, add_generation_prompt=True), repeat
        ),
    }


class _Model:
    """What the long-text encoder reads of a served model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer


def tokenisation(repeat: int) -> dict[str, float]:
    tokenizer = load_tokenizer("builtin")
    talk = agentic.Conversation(1, agentic.tokens_per_word(), HISTORY, NEW // 2, NEW // 2, "m")
    first, second = (
        tokenizer.apply_chat_template(json.loads(talk.next_turn())["messages"]) for _ in range(2)
    )
    encoder, model = LongTextEncoder(), _Model(tokenizer)
    copy = encoder._copy(model)  # type: ignore[arg-type]  # the tokenizer is all it reads
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in (first, second)]

    def remember() -> None:
        cache = PrefixCache(tokenizer)
        cache.remember(first, ids[0])
        start = time.thread_time()
        cached, rest = cache.split(second)
        cached.fromlist(ids[1][len(cached) :])  # the frontend appends the rest's ids
        split.append(time.thread_time() - start)
        start = time.thread_time()
        cache.remember(second, ids[1], len(second) - len(rest))
        spent.append(time.thread_time() - start)

    spent: list[float] = []
    split: list[float] = []
    for _ in range(repeat):
        remember()
    return {
        "first_turn_tokens": len(ids[0]),
        "first_turn_ms": cpu_ms(
            lambda: encoder._encode(model, first, False, 1 << 30),  # type: ignore[arg-type]
            repeat,
            time.process_time,
        ),
        "first_turn_cacheless_copy_ms": cpu_ms(  # the encoder's path for huge texts
            lambda: copy.encode_batch_fast([first], add_special_tokens=False),
            repeat,
            time.process_time,
        ),
        "first_turn_encode_batch_ms": cpu_ms(
            lambda: copy.encode_batch([first], add_special_tokens=False), repeat, time.process_time
        ),
        "later_turn_prefix_split_ms": round(min(split) * 1e3, 3),
        "later_turn_prefix_remember_ms": round(min(spent) * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/long_context.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "history_tokens": HISTORY, "new_tokens_a_turn": NEW, "block_size": BLOCK,
        "block_hashing": hashing(args.turns, args.repeat),
        "one_megabyte_chat_body": big_body(args.repeat),
        "multiturn_tokenisation": tokenisation(args.repeat),
    }  # fmt: skip
    result["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
