"""`dynamoctl configure --verify` on the issue's two cases, both loads: AI Configurator's
prediction against a simulation on mocker workers that take its step times
(docs/configure.md, "Verifying by simulation"). Writes benchmarks/results/configure_verify.json.

    python benchmarks/configure_verify.py        # about 10 minutes on 2 cores
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "llama-3.1-70b on 2 x 8 h100 (slurm)": [
        "--model", "meta-llama/Meta-Llama-3.1-70B", "--target-kind", "slurm", "--gpus", "16",
        "--isl", "4000", "--osl", "500", "--ttft", "1000", "--tpot", "50",
    ],
    "qwen3-8b on 1 h100 (local)": [
        "--model", "Qwen/Qwen3-8B", "--gpus", "1", "--isl", "1024", "--osl", "128",
        "--ttft", "300", "--tpot", "20",
    ],
}  # fmt: skip


def main() -> None:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in CASES.items():
            for load in ("rate", "concurrency"):
                out = Path(tmp) / f"{len(results)}.yaml"
                cmd = [sys.executable, "-m", "dynamoctl", "configure", *args, "--out", str(out),
                       "--verify", "--verify-load", load]  # fmt: skip
                print(f"[configure-verify] {name}, {load}", flush=True)
                subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
                figures = json.loads(out.with_suffix(".verify.json").read_text())
                figures.pop("recipe")
                results.append({"case": name, "args": args, **figures})
    path = REPO / "benchmarks" / "results" / "configure_verify.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        p, s = r["predicted"], r["simulated"]
        print(
            f"{r['case']:<38} {r['load']:<18} TTFT {p['ttft_ms']:7.0f} -> {s['ttft_ms']:7.0f}  "
            f"TPOT {p['tpot_ms']:5.1f} -> {s['tpot_ms']:5.1f}  tok/s/GPU "
            f"{p['tokens_per_s_gpu']:7.1f} -> {s['tokens_per_s_gpu']:7.1f}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
