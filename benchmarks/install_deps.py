"""How long `scripts/install-deps.sh` takes on a bare machine: each commit's script runs
from a clone of that commit into a fresh virtual environment (and a fresh clients venv)
with the pip and uv caches off, as on a machine that never installed anything. Each
``[install-deps]`` step is timed from its line to the next. The Debian packages are
whatever the machine has (the script skips those installed; the result says whether it
installed any). Commits run one after the other, in the order given, for ``--rounds``.

    python benchmarks/install_deps.py 6d0329d HEAD --out benchmarks/results/install_deps.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

REPO = Path(__file__).resolve().parents[1]
STEP = "[install-deps] "


def cpu() -> dict[str, Any]:
    """The CPU model and whether it has AVX-512 (CI machines of one kind differ in both)."""
    model, flags = "", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        if key.strip() == "flags" and not flags:
            flags = value
    return {"model": model, "avx512f": "avx512f" in flags.split()}


def commit_of(ref: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], check=True,
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip()


def run_once(commit: str, work: Path) -> dict[str, Any]:
    """Clone ``commit``, make a fresh venv and time its install-deps.sh into it."""
    clone, venv = work / "clone", work / "venv"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    venv_s = time.monotonic() - began
    env = {
        **os.environ,
        "PYTHON": str(venv / "bin" / "python"),
        "DYNAMOCTL_CLIENTS_VENV": str(work / "clients"),
        "PIP_NO_CACHE_DIR": "1",
        "UV_NO_CACHE": "1",
    }
    env.pop("PYTHONPATH", None)
    steps: list[dict[str, Any]] = [{"step": "python -m venv", "s": round(venv_s, 1)}]
    mark, lines = time.monotonic(), []
    command = ["bash", "scripts/install-deps.sh"]
    proc = subprocess.Popen(
        command, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    current = "start"
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith(STEP):
            now = time.monotonic()
            steps.append({"step": current, "s": round(now - mark, 1)})
            current, mark = line[len(STEP) :].strip(), now
    rc = proc.wait()
    steps.append({"step": current, "s": round(time.monotonic() - mark, 1)})
    total = time.monotonic() - began
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import vllm, torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    size = subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True)
    return {
        "commit": commit,
        "rc": rc,
        "total_s": round(total, 1),
        "steps": [s for s in steps if s["step"] != "start" or s["s"] >= 0.5],
        "apt_installed_some": any("apt-get install" in line for line in lines),
        "import_vllm_ok": check.returncode == 0,
        "torch": check.stdout.strip(),
        "venv_mb": int(size.stdout.split()[0]) if size.returncode == 0 else None,
        "tail": lines[-5:] if rc else [],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("refs", nargs="+", help="commits whose install-deps.sh to time")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/install_deps.json"))
    parser.add_argument("--append", action="store_true", help="add to --out's runs")
    args = parser.parse_args()
    commits = [commit_of(ref) for ref in args.refs]
    previous: dict[str, Any] = {}
    if args.append and Path(args.out).exists():
        previous = json.loads(Path(args.out).read_text())
    runs: list[dict[str, Any]] = previous.get("runs", [])
    for round_ in range(args.rounds):
        for commit in commits:
            work = Path(tempfile.mkdtemp(prefix="install-deps-"))
            try:
                result = run_once(commit, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            result["round"] = round_
            result["machine"] = machine()
            print(json.dumps(result), flush=True)
            runs.append(result)
    out = {**previous, "benchmark": "install_deps", "cpu": cpu(), "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
