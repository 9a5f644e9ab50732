"""What the frontend's inline tokenisation costs: ``Tokenizer.encode`` (ids, offsets and
token strings) against ``encode_batch_fast`` (ids without offsets) on one text, for texts
of a few to a few thousand tokens of the multiturn workload's words (benchmarks/agentic.py),
with the builtin tokenizer both benchmark systems serve.

    python benchmarks/tokenizer_encode.py [--repeat 7] [--out FILE]

Per size: CPU microseconds per call (``time.process_time`` over 200 calls; the tokenizer
may use threads of its own), the minimum of ``--repeat`` runs (the least disturbed), and
whether both give the same ids.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import agentic
from machine import machine

WORDS = (3, 30, 300, 1500)
"""Text sizes, in words of :data:`agentic.WORDS`."""
CALLS = 200


def cpu_us(call: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(CALLS):
            call()
        best = min(best, (time.process_time() - started) / CALLS)
    return round(best * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "tokenizer_encode.json",
    )
    args = parser.parse_args()
    tokenizer = agentic.builtin_tokenizer()
    rng = random.Random(0)
    rows = []
    for words in WORDS:
        text = " ".join(rng.choice(agentic.WORDS) for _ in range(words))
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        fast = tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        encode = cpu_us(lambda t=text: tokenizer.encode(t, add_special_tokens=False), args.repeat)
        batch_fast = cpu_us(
            lambda t=text: tokenizer.encode_batch_fast([t], add_special_tokens=False),
            args.repeat,
        )
        rows.append({
            "tokens": len(ids),
            "encode_us": encode,
            "encode_batch_fast_us": batch_fast,
            "ratio": round(batch_fast / encode, 3),
            "same_ids": ids == fast,
        })  # fmt: skip
        print(f"{len(ids):6d} tokens: encode {encode:8.1f} us  encode_batch_fast "
              f"{batch_fast:8.1f} us  x{batch_fast / encode:.2f}  same ids "
              f"{ids == fast}")  # fmt: skip
    report = {"machine": machine(), "repeat": args.repeat, "calls": CALLS, "sizes": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
