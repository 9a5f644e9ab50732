"""Tests of `dynamoctl configure` and the mocker's AI Configurator timing (marker
``configure``). They need the ``configure`` extra (scripts/install-deps.sh installs it):
each module starts with ``require_aic()``, which fails loudly under CI (or with
DYNAMOCTL_REQUIRE_CONFIGURE set), where a missing extra is a broken install, and skips
elsewhere."""

from __future__ import annotations

import importlib.util
import os

import pytest

SMALL = ["--model", "Qwen/Qwen3-8B", "--gpus", "1", "--isl", "1024", "--osl", "128"]
"""A small model on one local GPU (targets added per test)."""
LLAMA_70B = [
    "--model", "meta-llama/Meta-Llama-3.1-70B", "--target-kind", "slurm", "--gpus", "16",
    "--gpus-per-node", "8", "--isl", "4000", "--osl", "500", "--ttft", "1000", "--tpot", "50",
]  # fmt: skip
"""A 70B-class model on 2 x 8 H100 Slurm nodes (the issue's case)."""


def require_aic() -> None:
    if importlib.util.find_spec("aiconfigurator") is not None:
        return
    message = "aiconfigurator is not installed: pip install 'dynamoctl[configure]'"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_CONFIGURE"):
        pytest.fail(message + " (scripts/install-deps.sh does)", pytrace=False)
    pytest.skip(message, allow_module_level=True)
