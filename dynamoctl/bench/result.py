"""A benchmark's result as data, and its ``results.json`` form: what the report and the
plots are made from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from dynamoctl.bench.client import RequestRecord
from dynamoctl.bench.stats import Summary


class RunResult(msgspec.Struct):
    summary: Summary
    requests: list[RequestRecord]


class BenchResult(msgspec.Struct, kw_only=True):
    version: str
    started_at: str
    """ISO 8601, UTC."""
    endpoint: str
    model: str
    api: str
    workload: dict[str, Any]
    """The arguments that define the load, for rerunning it."""
    runs: list[RunResult]


def write_json(result: BenchResult, path: Path) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=1) + b"\n")


def read_json(path: Path) -> BenchResult:
    return msgspec.json.decode(path.read_bytes(), type=BenchResult)
