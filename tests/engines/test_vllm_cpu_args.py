"""vLLM's own argument parser, for real: a worker given a flag vLLM does not know exits
with one line that names it. No engine starts (the parser refuses first), so the test
runs in the parallel part, not beside test_vllm_cpu.py's deployment in the serial
``engines`` lane, where it took 12 to 121 s of that lane (the import of vLLM, at load 2
to 14). Needs ``vllm-cpu``: skipped without it on a developer's machine, a failure in CI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.tiny_llama import build_tiny_llama
from tests.engines.vllm_required import require

require("vllm")

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_bad_engine_argument_is_one_line(tmp_path: Path) -> None:
    model_dir = build_tiny_llama(tmp_path / "tiny-llama")
    result = subprocess.run(
        [sys.executable, "-m", "dynamoctl", "worker", "--engine", "vllm", "--discovery",
         f"embedded://{tmp_path}/scratch", "--model", str(model_dir),
         "--no-such-flag", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=240,  # vLLM's import: 121 s at load 14
    )  # fmt: skip
    assert result.returncode == 1
    assert "vllm engine arguments: unrecognized arguments: --no-such-flag 1" in result.stderr
