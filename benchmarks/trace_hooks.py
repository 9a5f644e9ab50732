"""What tracing costs a request when it is off: the frontend's hooks, each one read of
the ``TRACE`` context variable that finds None (docs/operations.md, "Traces").

    python benchmarks/trace_hooks.py [--out benchmarks/results/trace_hooks_off.json]

A request that is not disaggregated passes three hooks (``parse``/``tokenize`` in the
handler, one per pick, one per worker attempt); this times those three reads and tests,
best of 7 repeats of a million, and the request-plane message's size with the field at
its default against the same message encoded without it (the struct before it)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import timeit
from pathlib import Path

import msgspec

from dynamoctl.tracing import TRACE
from dynamoctl.wire import engine as wire_engine

HOOKS_PER_REQUEST = 3


def hooks() -> None:
    if TRACE.get() is not None:
        raise AssertionError
    if TRACE.get() is not None:
        raise AssertionError
    if TRACE.get() is not None:
        raise AssertionError


def message_bytes() -> tuple[int, int]:
    """(with the field at its default, without the field) for a 2,000-token prompt."""
    request = wire_engine.GenerateRequest("cmpl-0-0", list(range(2000)), 16)
    fields = msgspec.structs.asdict(request)
    del fields["trace_context"]
    return len(wire_engine.encode(request)), len(msgspec.msgpack.encode(list(fields.values())))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/trace_hooks_off.json")
    args = parser.parse_args()
    number = 1_000_000
    best = min(timeit.repeat(hooks, number=number, repeat=7)) / number
    with_field, without = message_bytes()
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "load_average_1_5_15": list(os.getloadavg()),
        "hooks_per_request": HOOKS_PER_REQUEST,
        "hooks_ns_per_request": round(best * 1e9, 1),
        "message_bytes_with_field": with_field,
        "message_bytes_without_field": without,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
