"""Run one place dynamoctl starts vLLM, then report, as JSON, the platform vLLM resolved in
that process and the kernel library that platform imports for the CPU at hand and for a
CPU with AVX2 only (tests/engines/test_vllm_platform.py).

    python tests/engines/vllm_platform_probe.py REPORT.json SCRIPT ARGS...
    python tests/engines/vllm_platform_probe.py REPORT.json -m MODULE ARGS...

The entry point runs unchanged, as on a CPU with AVX2 only, until it exits or fails (the
tests give it arguments that stop it once vLLM is imported). "AVX2 only" is simulated
where vLLM reads it: torch's ``torch.cpu._is_avx512_supported`` and
``_is_avx512_bf16_supported`` answer False. No kernel library is loaded: a finder records
each import of ``vllm._C``, ``vllm._C_AVX512`` or ``vllm._C_AVX2`` and refuses it, so the
probe runs the same on every x86-64 CPU. The report has what vLLM's platform detection
returned (``vllm bench`` replaces an unspecified platform with the CPU one afterwards,
once the kernels are imported), the kernels the entry point imported, and those its final
platform imports for the host's CPU and for an AVX2-only one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import re
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

KERNELS = re.compile(r"vllm\._C(_AVX\w+)?")
"""vLLM's kernel builds for x86-64 CPUs (the module name is the same in all three)."""


class KernelRecorder(importlib.abc.MetaPathFinder):
    """Records, and refuses, every import of a vLLM kernel library."""

    def __init__(self) -> None:
        self.imports: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if KERNELS.fullmatch(fullname):
            self.imports.append(fullname)
            raise ImportError(f"{fullname}: not loaded by the platform probe")
        return None


def run_entry_point(argv: list[str]) -> str:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``python`` would; how it ended."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return f"exit {exc.code}"
    except Exception as exc:  # the entry point's own failure, once vLLM was imported
        return f"raised {exc!r}"
    return "returned"


def kernels_imported(recorder: KernelRecorder) -> list[str]:
    """The kernel builds the process's platform imports (``import_kernels``), now."""
    from vllm.platforms import current_platform

    recorder.imports.clear()
    current_platform.import_kernels()
    return list(recorder.imports)


def main(report: Path, argv: list[str]) -> None:
    import torch
    import vllm.platforms  # resolves nothing yet: vLLM does on first use

    host_flags = {
        "avx512": torch.cpu._is_avx512_supported,
        "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
    }
    resolve = vllm.platforms.resolve_current_platform_cls_qualname
    resolved: list[str] = []  # what vLLM's detection chose (`vllm bench` may swap it later)

    def recording_resolve() -> str:
        resolved.append(resolve())
        return resolved[-1]

    def cpu_flags(avx512: bool) -> None:
        for name, flag in host_flags.items():
            setattr(torch.cpu, f"_is_{name}_supported", flag if avx512 else lambda: False)

    vllm.platforms.resolve_current_platform_cls_qualname = recording_resolve
    recorder = KernelRecorder()
    sys.meta_path.insert(0, recorder)
    cpu_flags(avx512=False)  # the entry point runs as on an AVX2-only CPU
    ended = run_entry_point(argv)
    entry_kernels = list(recorder.imports)
    platform = vllm.platforms.current_platform
    avx2 = kernels_imported(recorder)
    cpu_flags(avx512=True)
    out = {
        "ended": ended,
        "resolved": resolved,
        "entry_point_kernels": entry_kernels,
        "platform": [cls.__name__ for cls in type(platform).__mro__],
        "device_type": platform.device_type,
        "host_flags": {name: flag() for name, flag in host_flags.items()},
        "kernels": {"host": kernels_imported(recorder), "avx2": avx2},
    }
    report.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
