"""The suite's processes write and reuse bytecode caches (tests/conftest.py says why): a
process a test starts inherits an environment that lets Python write them."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_process_a_test_starts_may_write_bytecode_caches() -> None:
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ
    out = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.flags.dont_write_bytecode)"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert out.strip() == "0"
    assert not sys.dont_write_bytecode
