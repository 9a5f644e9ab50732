"""What a prompt's ids cost on the request path, as a list and packed (dynamoctl/wire/ids.py).

    python benchmarks/token_ids.py [--tokens 33000] [--repeat 200]

Each step a 33k-token prompt (the multiturn workload's later turn) takes between the
frontend's prefix cache and the worker's engine, CPU per call in one process (median of
``--repeat``): the prefix's ids out of the cache entry, packed for the router's hashing,
encoded in the ``generate`` request and decoded by the worker; each result's freeing
measured apart. "list" is how it went before ``wire/ids.py`` (a list of ints through
every step), "packed" with it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import msgspec
from machine import machine

from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.ids import packed


class _ListRequest(msgspec.Struct, array_like=True):
    """The ``generate`` request's first fields as they were: ids a list of ints."""

    request_id: str
    token_ids: list[int]
    max_tokens: int


def cpu_us(step: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median CPU of making ``step``'s result and of freeing it, in microseconds."""
    make, free = [], []
    for _ in range(repeat):
        start = time.thread_time()
        out = step()
        made = time.thread_time()
        del out
        make.append(made - start)
        free.append(time.thread_time() - made)
    return {
        "make": round(statistics.median(make) * 1e6, 1),
        "free": round(statistics.median(free) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=33000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "token_ids.json"
    )
    args = parser.parse_args()
    rng = random.Random(0)
    ids = [rng.randrange(128256) for _ in range(args.tokens)]
    entry = array("I", ids)  # what the prefix cache holds either way
    as_list = ids[:]
    as_array = packed(ids)
    list_body = msgspec.msgpack.encode(_ListRequest("r", as_list, 200))
    array_body = wire_engine.encode(GenerateRequest("r", as_array, 200))
    old_decoder = msgspec.msgpack.Decoder(_ListRequest)
    steps: dict[str, dict[str, Callable[[], object]]] = {
        "prefix ids out of the cache": {"list": entry.tolist, "packed": lambda: entry[:]},
        "packed for hashing": {
            "list": lambda: array("I", as_list),
            "packed": lambda: packed(as_array),
        },
        "encoded in the request": {
            "list": lambda: msgspec.msgpack.encode(_ListRequest("r", as_list, 200)),
            "packed": lambda: wire_engine.encode(GenerateRequest("r", as_array, 200)),
        },
        "decoded by the worker": {
            "list": lambda: old_decoder.decode(list_body),
            "packed": lambda: wire_engine.decode_request(array_body),
        },
    }
    rows = {
        name: {way: cpu_us(step, args.repeat) for way, step in ways.items()}
        for name, ways in steps.items()
    }
    for name, row in rows.items():
        print(f"{name:<30} list {row['list']}  packed {row['packed']} (us)")
    report = {
        "machine": machine(),
        "tokens": args.tokens,
        "repeat": args.repeat,
        "cpu_us_median": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
