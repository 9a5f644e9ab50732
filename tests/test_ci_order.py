"""How `make test` splits and orders the suite (tests/conftest.py): the parallel part's
files start slowest first and stay whole, the serial tests keep their order, and the list
of slow files names files that exist (a renamed one would silently stop going first)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import _SLOW_FIRST, _parallel_order

REPO = Path(__file__).resolve().parents[1]


def test_every_file_listed_slow_first_exists() -> None:
    missing = [path for path in _SLOW_FIRST if not (REPO / path).is_file()]
    assert missing == []
    assert len(set(_SLOW_FIRST)) == len(_SLOW_FIRST)


def test_listed_files_go_first_in_their_order_then_most_tests_and_serial_last() -> None:
    first, second = _SLOW_FIRST[0], _SLOW_FIRST[1]
    collected = [
        ("tests/a.py::t1", None), ("tests/a.py::t2", None),
        ("tests/serial.py::s1", "hosts"),
        (f"{second}::x1", None),
        ("tests/b.py::t1", None), ("tests/b.py::t2", None), ("tests/b.py::t3", None),
        (f"{first}::y1", None), (f"{first}::y2", None),
        ("tests/serial.py::s2", "hosts"),
        ("tests/c.py::t1", None),
    ]  # fmt: skip
    items: list[Any] = [SimpleNamespace(nodeid=nodeid) for nodeid, _ in collected]
    ordered = [item.nodeid for item in _parallel_order(items, [lane for _, lane in collected])]
    assert ordered == [
        f"{first}::y1", f"{first}::y2",
        f"{second}::x1",
        "tests/b.py::t1", "tests/b.py::t2", "tests/b.py::t3",
        "tests/a.py::t1", "tests/a.py::t2",
        "tests/c.py::t1",
        "tests/serial.py::s1", "tests/serial.py::s2",
    ]  # fmt: skip
