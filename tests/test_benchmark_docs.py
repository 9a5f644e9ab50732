"""Every table in docs/benchmarks.md names the result file its figures come from, and every
number its rows print is in that file (at the precision the doc prints it).

The convention: the line just above a table (blank lines aside) is
``<!-- results: benchmarks/results/X.json -->`` (several files: comma-separated). The
numbers of a row are those after its first cell (which names the case: "128 workers",
"host 4x GPU"). A number matches a number in the file when it rounds to it: ``101.9``
matches 101.87, ``172`` matches 171.6, ``339,408`` matches 339408. A number followed by
``%`` also matches a fraction (``4.6%`` ↔ 0.046) and one followed by `` s`` also matches
milliseconds (``28.4 s`` ↔ 28412 ms). Keys that are numbers (results by level) count. Long
time series (lists of over 64 items) are not searched, so a figure cannot match by chance
among thousands of samples.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = re.compile(r"^<!-- results: (.+?) -->$")
# A number that stands alone: not part of a word (p99, x86, 1M) or of a longer number.
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w.]|,\d{3})(%| s\b)?")
SERIES_MAX = 64


def tables(text: str) -> Iterator[tuple[int, list[str], list[str]]]:
    """(line number of the header, result files named above it, data rows) per table."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("|") and i + 1 < len(lines) and "---" in lines[i + 1]):
            i += 1
            continue
        above = next((line for line in reversed(lines[:i]) if line.strip()), "")
        found = RESULTS.match(above.strip())
        files = [f.strip() for f in found.group(1).split(",")] if found else []
        end = i + 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        yield i + 1, files, lines[i + 2 : end]
        i = end


def numbers_in(value: object) -> Iterator[float]:
    """Every number in a parsed JSON document, skipping long series."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if re.fullmatch(r"\d+(\.\d+)?", key):  # results keyed by a level: "1000.0"
                yield float(key)
            yield from numbers_in(item)
    elif isinstance(value, list) and len(value) <= SERIES_MAX:
        for item in value:
            yield from numbers_in(item)


def printed(row: str) -> Iterator[tuple[str, float, float, str]]:
    """(as printed, value, half the last printed digit, unit) for each number in a row."""
    for whole, decimals, unit in NUMBER.findall(row.replace("**", "")):
        text = whole + decimals
        places = len(decimals) - 1 if decimals else 0
        yield text, float(text.replace(",", "")), 0.5 * 10**-places + 1e-9, unit.strip()


def unbacked(row: str, values: list[float]) -> list[str]:
    """The numbers of ``row`` that no value in ``values`` rounds to."""
    missing = []
    for text, number, slack, unit in printed(row):
        scales = [1.0] + ([100.0] if unit == "%" else []) + ([1e-3] if unit == "s" else [])
        if not any(abs(v * k - number) <= slack for v in values for k in scales):
            missing.append(text + unit)
    return missing


def test_tables_are_found() -> None:
    assert len(list(tables(DOC.read_text(encoding="utf-8")))) >= 15


def test_unit_conversions_match_only_what_they_should() -> None:
    assert unbacked("| 4.6% | 28.4 s | 339,408 | 172 |", [0.046, 28412.0, 339408, 171.6]) == []
    assert unbacked("| 4.6 | 28.4 | 101.9 |", [0.046, 28412.0, 101.84]) == ["4.6", "28.4", "101.9"]
    assert unbacked("| p99 lag 1M x86 |", []) == []


@pytest.mark.parametrize(
    ("line", "files", "rows"),
    list(tables(DOC.read_text(encoding="utf-8"))),
    ids=lambda v: str(v) if isinstance(v, int) else "",
)
def test_each_table_row_is_in_its_result_file(line: int, files: list[str], rows: list[str]) -> None:
    assert files, f"docs/benchmarks.md:{line}: no '<!-- results: FILE -->' line above the table"
    values: list[float] = []
    for name in files:
        path = REPO / name
        assert path.parent == REPO / "benchmarks" / "results" and path.is_file(), name
        values += numbers_in(json.loads(path.read_text(encoding="utf-8")))
    cells = [row.strip().strip("|").split("|") for row in rows]
    missing = [(cell[0].strip(), unbacked("|".join(cell[1:]), values)) for cell in cells]
    assert [(label, nums) for label, nums in missing if nums] == [], (
        f"docs/benchmarks.md:{line}: figures not in {', '.join(files)}"
    )
