"""GPU smoke test of the real engines, for anyone with an NVIDIA GPU and an engine installed.

    python tests/gpu/smoke.py                      # every engine that imports, on GPU 0
    python tests/gpu/smoke.py --engines vllm --gpu 1 --out results.json
    python tests/gpu/smoke.py --engines vllm --gpus 2,3   # the multi-node case on GPUs 2, 3
    python tests/gpu/smoke.py --dry-run            # write and validate the recipes only

For each of vLLM, SGLang and TensorRT-LLM that imports: build a tiny random-weights Llama
(``tests/engines/tiny_llama.py``), ``dynamoctl up`` a generated local recipe (that engine
on one GPU, plus the frontend), send the same long chat twice (the second must report
cached tokens), check that a KV router following the deployment indexed a prompt from the
worker's own ``BlockStored`` events, then ``dynamoctl down``. With vLLM and NIXL both
importable, a prefill/decode pair with ``NixlConnector`` is brought up too and must serve
a chat. With vLLM and two GPUs (``--gpus``), a multi-node replica too: vLLM tensor
parallel 2 over two "nodes" of this machine (network namespaces reached by SSH, as
``tests/engines/test_vllm_cpu_gang.py`` builds them; each node's sshd gives its sessions
one of the two GPUs), a leader and a headless follower meeting over NCCL; it must serve
the same checks. Fewer than two GPUs, no root or no sshd: SKIPPED with the reason.
Prints a PASS/FAIL/SKIPPED table and writes the rows as JSON; exits 1 on any FAIL.

Not collected by pytest (no ``test_`` prefix); ``tests/gpu/test_smoke_plan.py`` checks
its recipes on any machine. Nothing here has run on a GPU inside the project yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("vllm", "sglang", "trtllm")
MODULES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}
MODEL = "tiny-llama"
BLOCK = 32  # accepted by every engine's paged KV cache
PROMPT = "The harbour master counted the ships that came in with the morning tide. " * 12

ENGINE_ARGS: dict[str, dict[str, Any]] = {
    # bfloat16: the tiny model's weights are float32, which GPU attention kernels refuse.
    "vllm": {"dtype": "bfloat16", "enforce-eager": True, "kv-cache-memory-bytes": 256 << 20},
    "sglang": {"dtype": "bfloat16", "mem-fraction-static": 0.2, "disable-cuda-graph": True},
    "trtllm": {
        "dtype": "bfloat16",
        "kv-cache-config": {"free_gpu_memory_fraction": 0.2, "enable_block_reuse": True},
    },
}
NIXL = {"kv-transfer-config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}}

Status = Literal["PASS", "FAIL", "SKIPPED"]


@dataclass
class Row:
    """One line of the result table."""

    deployment: str
    check: str
    status: Status
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)

    def add(self, deployment: str, check: str, status: Status, detail: str = "") -> None:
        self.rows.append(Row(deployment, check, status, detail))

    def timed(self, deployment: str, check: str, fn: Callable[[], str]) -> bool:
        """Run ``fn`` (returns a detail; raises to fail) as one row; True when it passed."""
        began = time.monotonic()
        try:
            detail, status = fn(), "PASS"
        except Exception as exc:  # a smoke test reports every failure and goes on
            detail, status = f"{type(exc).__name__}: {exc}"[:300], "FAIL"
        self.rows.append(Row(deployment, check, status, detail, time.monotonic() - began))
        return status == "PASS"

    @property
    def failed(self) -> bool:
        return any(row.status == "FAIL" for row in self.rows)

    def table(self) -> str:
        width = max([len(r.deployment) for r in self.rows] + [10])
        lines = [f"{'deployment':<{width}}  {'check':<16} {'status':<8} {'secs':>6}  detail"]
        for r in self.rows:
            lines.append(
                f"{r.deployment:<{width}}  {r.check:<16} {r.status:<8} {r.seconds:6.1f}  {r.detail}"
            )
        return "\n".join(lines)


# ----------------------------------------------------------------------- recipes


def _pool(engine: str, gpu: int, extra: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    # gpus_per_replica 0 + CUDA_VISIBLE_DEVICES: exactly the GPU asked for, and a P/D pair
    # can share it.
    return {
        "engine": engine,
        "replicas": 1,
        "gpus_per_replica": 0,
        "engine_args": {**ENGINE_ARGS[engine], **extra},
        "env": {"CUDA_VISIBLE_DEVICES": str(gpu), **env},
    }


def recipe(name: str, engine: str, model_dir: Path, port: int, gpu: int, pd: bool = False) -> str:
    """A local recipe: one ``engine`` worker (or a NIXL prefill/decode pair) and a frontend.
    JSON is YAML, so the text is also what ``dynamoctl up`` reads."""
    if pd:
        workers = {
            # One NIXL side channel per engine: both run on this host.
            role: _pool(engine, gpu, NIXL, {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())})
            for role in ("prefill", "decode")
        }
    else:
        workers = {"agg": _pool(engine, gpu, {}, {})}
    doc = {
        "schema": 1,
        "name": name,
        "model": {"name": MODEL, "path": str(model_dir), "block_size": BLOCK,
                  "context_length": 4096},
        "frontend": {"port": port, "router": {"mode": "kv"}},
        "workers": workers,
        "supervision": {"start_timeout": 900, "restart_budget": 0},
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


GANG = "smoke-vllm-2node"
"""The multi-node case: one vLLM engine over two namespace "nodes", one GPU each."""
GANG_TARGET: dict[str, Any] = {
    "kind": "ssh", "hosts": ["smoke-node1", "smoke-node2"], "python": "python3",
    "workdir": "/tmp",
}  # fmt: skip
"""The dry run's stand-in for the namespace hosts' ``target`` (``SshHosts.target_yaml``)."""


def gang_recipe(model_dir: Path, port: int, target: dict[str, Any] = GANG_TARGET) -> str:
    """The multi-node case: vLLM TP=2 as a gang of two nodes (``nodes_per_replica: 2``),
    ``gpus_per_replica: 0`` so that each node's ``CUDA_VISIBLE_DEVICES`` (set by its
    sshd) is the GPU its rank uses; ``target``: the hosts' ``target`` section."""
    pool = {
        "engine": "vllm",
        "replicas": 1,
        "nodes_per_replica": 2,
        "gpus_per_replica": 0,
        "engine_args": {**ENGINE_ARGS["vllm"], "tensor-parallel-size": 2},
    }
    doc = {
        "schema": 1,
        "name": GANG,
        "discovery": {"backend": "etcd", "managed": True},
        "target": target,
        "model": {"name": MODEL, "path": str(model_dir), "block_size": BLOCK,
                  "context_length": 4096},
        "frontend": {"port": port, "router": {"mode": "kv"}},
        "workers": {"agg": pool},
        "supervision": {"start_timeout": 900, "restart_budget": 0},
        "security": {"open_endpoint": True},  # a smoke test's private hosts
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


def gang_skip_reason(gpus: Sequence[int]) -> str | None:
    """Why the multi-node case cannot run here (None: it can): two distinct GPUs that
    nvidia-smi lists, root (network namespaces) and sshd."""
    if len(set(gpus)) != 2:
        return f"needs two distinct GPUs (--gpus), got {','.join(map(str, gpus))}"
    for gpu in gpus:
        if why := gpu_error(gpu):
            return f"needs two GPUs: {why}"
    if os.geteuid() != 0:
        return "needs root (network namespaces for the two nodes)"
    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server (sshd) for the two nodes"
    return None


def run_gang(results: Results, model_dir: Path, workdir: Path, gpus: Sequence[int],
             timeout: float) -> None:  # fmt: skip
    """The multi-node case on two namespace nodes of this machine, one GPU each."""
    from ruamel.yaml import YAML

    from tests.infra.ssh_hosts import ssh_hosts, tree_python

    env = [{"CUDA_VISIBLE_DEVICES": str(gpu)} for gpu in gpus]
    nodes = Path(tempfile.mkdtemp(prefix="nodes-", dir=workdir))  # keys, sshd configs
    with ssh_hosts(2, nodes, host_env=env) as hosts:
        section = hosts.target_yaml(nodes, tree_python(nodes))
        target = YAML(typ="safe").load(section)["target"]
        path = workdir / f"{GANG}.yaml"
        path.write_text(gang_recipe(model_dir, free_port(), target))
        run_one(results, GANG, path, workdir / "home", model_dir, timeout)


def plans(model_dir: Path, gpu: int, engines: Sequence[str]) -> dict[str, str]:
    """Deployment name → recipe text, for the engines asked for."""
    out = {f"smoke-{e}": recipe(f"smoke-{e}", e, model_dir, free_port(), gpu) for e in engines}
    if "vllm" in engines:
        out["smoke-vllm-pd"] = recipe("smoke-vllm-pd", "vllm", model_dir, free_port(), gpu, True)
    return out


def validate(path: Path) -> str:
    """Load ``path`` as ``dynamoctl up`` does (schema and rules); returns the path."""
    from dynamoctl.recipe.loader import load_recipe

    load_recipe(path)
    return str(path)


# ----------------------------------------------------------------------- probes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def import_error(module: str) -> str | None:
    """None when ``module`` imports in a fresh interpreter, else its last error line."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=600
    )
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def gpu_error(gpu: int) -> str | None:
    """None when ``nvidia-smi`` lists GPU ``gpu``, else why not."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU (nvidia-smi not found)"
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    listed = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    if proc.returncode != 0 or len(listed) <= gpu:
        return f"GPU {gpu} not listed by nvidia-smi -L ({len(listed)} GPU(s))"
    return None


# ----------------------------------------------------------------------- one deployment


class Deployment:
    def __init__(self, name: str, path: Path, home: Path) -> None:
        self.name, self.path, self.home = name, path, home
        self.base_url = ""

    def cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DYNAMOCTL_HOME": str(self.home)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.home / "runs" / self.name / "state.json").read_text())  # type: ignore[no-any-return]

    def up(self, timeout: float) -> str:
        proc = self.cli("up", str(self.path), "--detach", timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"up exited {proc.returncode}: {' | '.join(tail)}")
        self.base_url = str(self.state["plan"]["endpoint"])
        return f"serving at {self.base_url}"

    def down(self) -> str:
        proc = self.cli("down", self.name, timeout=300)
        if proc.returncode != 0:
            self.cli("down", self.name, "--now", timeout=120)
            raise RuntimeError(f"down exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
        return "stopped"

    def chat(self) -> dict[str, Any]:
        body = {"model": MODEL, "max_tokens": 16,
                "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
        response = httpx.post(f"{self.base_url}/chat/completions", json=body, timeout=120)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]


def check_cached(dep: Deployment) -> str:
    first, again = dep.chat(), dep.chat()
    assert first["usage"]["completion_tokens"] > 0, first["usage"]
    details = again["usage"].get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    assert cached > 0, f"second chat reported no cached tokens: {again['usage']}"
    return f"{cached} of {again['usage']['prompt_tokens']} prompt tokens cached"


def check_router(dep: Deployment, model_dir: Path) -> str:
    """A KV router following the deployment indexes a prompt the worker just computed:
    the worker's BlockStored events reached it."""
    from dynamoctl.discovery import Discovery, store_from_url
    from dynamoctl.router import KvRouter, RouterService
    from dynamoctl.tokenizer.loader import load_tokenizer

    prompt = PROMPT + " Once more."
    tokens = load_tokenizer(str(model_dir)).encode(prompt)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    httpx.post(f"{dep.base_url}/completions", json=body, timeout=120).raise_for_status()
    plan = dep.state["plan"]

    async def follow() -> dict[str, int]:
        async with Discovery(store_from_url(plan["discovery_url"]), lease_ttl=5) as disc:
            router = KvRouter("kv", BLOCK)
            async with RouterService(disc, plan["namespace"], MODEL, router, idle_poll=0.2):
                deadline = time.monotonic() + 60
                while not (matches := router.find_matches(tokens)):
                    if time.monotonic() > deadline:
                        raise AssertionError("no BlockStored event indexed the prompt in 60 s")
                    await asyncio.sleep(0.2)
                return dict(matches)

    matches = asyncio.run(follow())
    return f"{max(matches.values())} of {len(tokens) // BLOCK} blocks indexed"


def check_pd(dep: Deployment) -> str:
    answer = dep.chat()
    assert answer["usage"]["completion_tokens"] > 0, answer["usage"]
    return f"{answer['usage']['completion_tokens']} tokens through prefill → decode"


def check_gang(dep: Deployment) -> str:
    """The replica is a gang of two members on two nodes, both READY."""
    proc = dep.cli("status", dep.name, "--json", timeout=60)
    rows = {row["name"]: row for row in json.loads(proc.stdout)["instances"]}
    leader, follower = rows["agg-0"], rows["agg-0.1"]
    assert (leader["state"], follower["state"]) == ("READY", "READY"), (leader, follower)
    assert leader["host"] != follower["host"], (leader["host"], follower["host"])
    return f"leader on {leader['host']}, follower on {follower['host']}"


def run_one(results: Results, name: str, path: Path, home: Path, model_dir: Path,
            timeout: float) -> None:  # fmt: skip
    dep = Deployment(name, path, home)
    if not results.timed(name, "up", lambda: dep.up(timeout)):
        dep.cli("down", name, "--now", timeout=120)
        return
    try:
        if name.endswith("-pd"):
            results.timed(name, "chat P/D", lambda: check_pd(dep))
        elif name == GANG:
            results.timed(name, "gang members", lambda: check_gang(dep))
            results.timed(name, "cached tokens", lambda: check_cached(dep))
        else:
            results.timed(name, "cached tokens", lambda: check_cached(dep))
            results.timed(name, "router events", lambda: check_router(dep, model_dir))
    finally:
        results.timed(name, "down", dep.down)


# ----------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated subset of: " + ", ".join(ENGINES))  # fmt: skip
    parser.add_argument("--gpu", type=int, default=0, help="GPU index (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--gpus", default="0,1",
                        help="the two GPUs of the multi-node case, one per node")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default: workdir)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for each `up`")
    parser.add_argument("--dry-run", action="store_true", help="write the recipes, start nothing")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    try:
        args.gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        parser.error(f"--gpus {args.gpus!r}: two GPU indices, e.g. 0,1")
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; valid: {', '.join(ENGINES)}")
    return args


def run_gang_case(
    results: Results, model_dir: Path, workdir: Path, args: argparse.Namespace
) -> None:
    """The multi-node case: validated in a dry run, SKIPPED (with why) where it cannot run."""
    if args.dry_run:
        path = workdir / f"{GANG}.yaml"
        path.write_text(gang_recipe(model_dir, free_port()))
        results.timed(GANG, "recipe", lambda: validate(path))
    elif why := gang_skip_reason(args.gpus) or import_error(MODULES["vllm"]):
        results.add(GANG, "import", "SKIPPED", why)
    else:
        run_gang(results, model_dir, workdir, args.gpus, args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.engines.tiny_llama import build_tiny_llama

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dynamoctl-gpu-smoke-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / MODEL
    if not model_dir.exists():
        build_tiny_llama(model_dir)
    results = Results()
    no_gpu = None if args.dry_run else gpu_error(args.gpu)
    runnable: list[str] = []
    for engine in args.engines:
        reason = no_gpu or (None if args.dry_run else import_error(MODULES[engine]))
        if reason:
            results.add(f"smoke-{engine}", "import", "SKIPPED", reason)
        else:
            runnable.append(engine)
    for name, text in plans(model_dir, args.gpu, runnable).items():
        path = workdir / f"{name}.yaml"
        path.write_text(text)
        if name.endswith("-pd") and not args.dry_run and (why := import_error("nixl")):
            results.add(name, "import", "SKIPPED", f"nixl: {why}")
        elif args.dry_run:
            results.timed(name, "recipe", lambda path=path: validate(path))
        else:
            run_one(results, name, path, workdir / "home", model_dir, args.timeout)
    if "vllm" in args.engines:
        run_gang_case(results, model_dir, workdir, args)
    out = args.out or workdir / "results.json"
    out.write_text(json.dumps([asdict(row) for row in results.rows], indent=2) + "\n")
    print(results.table())
    print(f"results: {out}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
