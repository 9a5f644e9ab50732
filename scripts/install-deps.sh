#!/usr/bin/env bash
# Install what dynamoctl's test suite needs on a fresh Debian/Ubuntu machine:
# the real servers the tests start (etcd, ...) and the Python package with its test extra.
# Idempotent: packages already present are not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

# etcd: discovery tests; slurm + munge: the Slurm launcher tests run a real single-node
# cluster; openssh-server + iproute2: the SSH launcher tests run sshd in network namespaces.
APT_PACKAGES=(etcd-server slurmctld slurmd slurm-client munge openssh-server iproute2)
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
