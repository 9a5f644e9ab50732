"""What the word cache buys (dynamoctl/tokenizer/words.py): CPU of tokenising texts with
the tokenizer alone against through the cache, side by side in one process, on one
thread (``encode_batch_fast``, no post-processor, as the frontend's chat path encodes).

    python benchmarks/word_cache.py [--repeat 5] [--out FILE]

Texts:

- ``first turn``: the multiturn workload's first turn (benchmarks/agentic.py, a 32k-token
  history rendered with the builtin template), ``cold`` through a fresh cache and ``warm``
  through one that has seen another conversation: the workload's words are few, so this
  is the cache's best case;
- ``new text``: a later turn's new text (the answer and the next user message);
- ``repository text``: what a cache meets in real use, text it has mostly not seen: this
  repository's docs and sources (``docs/*.md``, ``dynamoctl/**/*.py``) cut into texts of
  2 KB, 20 KB and 150 KB, each fed once, in order, through one fresh cache (which learns
  as it goes), against the tokenizer alone on the same texts.

Per text and way the median of ``--repeat`` runs, the two ways alternating; ids checked
equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import agentic
from machine import machine
from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer import load_tokenizer
from dynamoctl.tokenizer.words import WordCache

REPO = Path(__file__).resolve().parents[1]
SIZES = (2_000, 20_000, 150_000)
"""Repository text cut into texts of these many characters."""
REPO_CHARS = 1_200_000
"""Repository text used per size (the first this many characters)."""


def rendered(seed: int) -> tuple[str, str]:
    """A conversation's first turn and its second turn's new text, rendered."""
    tokenizer = load_tokenizer("builtin")
    ratio = agentic.tokens_per_word()
    talk = agentic.Conversation(seed, ratio, 32_000, 200, 200, "m")
    talk.next_turn()
    first = tokenizer.apply_chat_template(talk.messages, add_generation_prompt=True)
    talk.next_turn()
    second = tokenizer.apply_chat_template(talk.messages, add_generation_prompt=True)
    cut = first.rfind("<|end_header_id|>") + len("<|end_header_id|>")  # the prefix cache's
    return first, second[cut:]


def repository_text() -> str:
    files = sorted(REPO.glob("docs/*.md")) + sorted(REPO.glob("dynamoctl/**/*.py"))
    return "".join(f.read_text() for f in files)[:REPO_CHARS]


def cpu_of(encode: Callable[[str], list[int]], texts: list[str]) -> tuple[float, list[list[int]]]:
    """CPU seconds to encode ``texts`` in order, and their ids."""
    start = time.process_time()
    ids = [encode(text) for text in texts]
    return time.process_time() - start, ids


def side_by_side(
    name: str, texts: list[str], warm_with: list[str], repeat: int
) -> dict[str, object]:
    """Median CPU of the tokenizer alone and of a fresh cache (first fed ``warm_with``)."""
    spec = load_tokenizer("builtin").backend.to_str()
    runs: dict[str, list[float]] = {"tokenizer": [], "word_cache": []}
    for i in range(repeat):
        # Each way its own copy of the tokenizer: the BPE's own word cache starts empty too.
        backend = FastTokenizer.from_str(spec)
        cache = WordCache.of(FastTokenizer.from_str(spec))
        assert cache is not None
        for text in warm_with:
            cache.encode(text)
            backend.encode_batch_fast([text], add_special_tokens=False)

        def plain(text: str, backend: FastTokenizer = backend) -> list[int]:
            ids: list[int] = backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
            return ids

        ways: dict[str, Callable[[str], list[int]]] = {
            "tokenizer": plain,
            "word_cache": cache.encode,
        }
        order = list(ways) if i % 2 == 0 else list(reversed(ways))
        got = {}
        for way in order:
            cpu, got[way] = cpu_of(ways[way], texts)
            runs[way].append(cpu)
        assert got["tokenizer"] == got["word_cache"]
    row: dict[str, object] = {"text": name, "texts": len(texts),
                              "chars": sum(map(len, texts))}  # fmt: skip
    for way, cpus in runs.items():
        row[f"{way}_cpu_ms"] = round(statistics.median(cpus) * 1e3, 2)
    row["cpu_ratio"] = round(
        statistics.median(runs["word_cache"]) / statistics.median(runs["tokenizer"]), 3
    )
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "word_cache.json"
    )
    args = parser.parse_args()
    first, new = rendered(1)
    other, _ = rendered(2)
    rows = [
        side_by_side("first turn, cold", [first], [], args.repeat),
        side_by_side("first turn, warm", [first], [other], args.repeat),
        side_by_side("new text, warm", [new], [other], args.repeat),
    ]
    corpus = repository_text()
    for size in SIZES:
        texts = [corpus[i : i + size] for i in range(0, len(corpus), size)]
        rows.append(side_by_side(f"repository text, {size} chars each", texts, [], args.repeat))
    report = {"machine": machine(), "repeat": args.repeat, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
