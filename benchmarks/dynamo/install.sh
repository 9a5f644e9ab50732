#!/usr/bin/env bash
# Install NVIDIA Dynamo 1.6.1 (the peer we compare against) into its own venv, on CPU.
#
#   benchmarks/dynamo/install.sh [VENV]      # default: benchmarks/.dynamo-venv
#
# `pip install ai-dynamo` fails on this kind of machine: its dependency `aisimulate` is a
# stub that downloads from another index, and it pins a certifi newer than PyPI mirrors may
# have. Its mocker and frontend import neither, so: its other requirements by hand, then the
# two wheels without dependencies.
set -euo pipefail
VENV=${1:-$(dirname "$0")/../.dynamo-venv}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check \
    'aiohttp>=3.14.3,<4' 'kubernetes>=32.0.1,<33' 'msgspec>=0.19' 'prometheus-client>=0.23.1,<1' \
    'pyzmq>=26' 'redis>=6.2,<9' tqdm 'transformers>=4.56' 'typing-extensions>=4.10' \
    'zstandard>=0.23,<1' 'pydantic>=2.10.6,<=2.13.5' 'uvloop>=0.21' certifi
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
    ai-dynamo-runtime==1.6.1 ai-dynamo==1.6.1
"$VENV/bin/python" -c "import dynamo.frontend, dynamo.mocker; print('dynamo 1.6.1 ready in $VENV')"
