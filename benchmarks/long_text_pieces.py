"""What cutting a long prompt into pieces buys: wall time and CPU of tokenising an agent's
first turn (a rendered chat prompt of a 32k- or 100k-token history) whole, against in
pieces the tokenizer's threads encode at once (dynamoctl/tokenizer/pieces.py), side by side
in one process.

    python benchmarks/long_text_pieces.py [--repeat 9] [--out FILE]

The text is the multiturn workload's first turn (benchmarks/agentic.py), rendered with the
builtin tokenizer's chat template, encoded as the frontend's long-text threads do
(``encode_batch_fast``, no post-processor; the cut included in the pieces' time). Per size
and way: the median of ``--repeat`` runs, the two ways alternating; ids checked equal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import agentic
from machine import machine

from dynamoctl.tokenizer import load_tokenizer, pieces

HISTORIES = (32_000, 100_000)
"""History sizes, in tokens."""


def first_turn(history: int) -> str:
    tokenizer = load_tokenizer("builtin")
    ratio = agentic.tokens_per_word()
    conversation = agentic.Conversation(1, ratio, history, 200, 200, "m")
    conversation.next_turn()
    return tokenizer.apply_chat_template(conversation.messages, add_generation_prompt=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument(
        "--out", type=Path,
        default=Path(__file__).parent / "results" / "long_text_pieces.json",
    )  # fmt: skip
    args = parser.parse_args()
    backend = load_tokenizer("builtin").backend
    cores = len(os.sched_getaffinity(0))
    rows = []
    for history in HISTORIES:
        text = first_turn(history)
        runs: dict[str, list[tuple[float, float]]] = {"whole": [], "pieces": []}
        ids: dict[str, list[int]] = {}
        for i in range(args.repeat):
            for way in ("whole", "pieces") if i % 2 == 0 else ("pieces", "whole"):
                wall, cpu = time.perf_counter(), time.process_time()
                parts = pieces.pieces(backend, text, 1 if way == "whole" else cores)
                encoded = backend.encode_batch_fast(parts, add_special_tokens=False)
                runs[way].append((time.perf_counter() - wall, time.process_time() - cpu))
                ids[way] = [t for e in encoded for t in e.ids]
        assert ids["whole"] == ids["pieces"]
        row = {"history_tokens": history, "chars": len(text), "tokens": len(ids["whole"]),
               "pieces": len(pieces.pieces(backend, text, cores))}  # fmt: skip
        for way, got in runs.items():
            row[f"{way}_wall_ms"] = round(statistics.median(w for w, _ in got) * 1e3, 1)
            row[f"{way}_cpu_ms"] = round(statistics.median(c for _, c in got) * 1e3, 1)
        row["wall_ratio"] = round(row["pieces_wall_ms"] / row["whole_wall_ms"], 3)
        row["cpu_ratio"] = round(row["pieces_cpu_ms"] / row["whole_cpu_ms"], 3)
        rows.append(row)
        print(json.dumps(row))
    report = {"machine": machine(), "cores": cores, "repeat": args.repeat, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
