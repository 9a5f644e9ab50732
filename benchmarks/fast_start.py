"""Fast start: weights read from a node's model cache against the throttled shared path,
and 8 replicas on 4 nodes staged with and without coordination.

    flock /tmp/dynamoctl-cluster.lock python benchmarks/fast_start.py \
        [--model-mib 2048] [--rate-mbit 1000] [--rounds 3] [--tree] [--out FILE]

Run from the repository root with ``PYTHONPATH=$PWD`` (it uses the tests' namespace hosts,
tests/infra/). A generated checkpoint (safetensors shards of noise, tests/infra/model_dir.py)
is exported by a file server in its own network namespace (OpenSSH's ``sftp-server``,
mounted with ``sshfs -o direct_io``: every read crosses the link) whose link ``tc`` limits
to ``--rate-mbit``; four nodes (namespaces) read it.

- ``from_shared_s`` / ``from_cache_s``: one replica's weight load (every tensor of every
  shard read into memory, as vLLM's default safetensors loader does), staging excluded,
  from the shared mount and from the node's cache entry (just staged, so from the page
  cache: the N-th replica on a node that has the model). Arms alternate each round.
- ``staging_coordinated_s``: 8 replicas (2 per node) start at once, each staging into its
  node's cache (``python -m dynamoctl.modelcache``, what a worker does before its engine):
  one read of the shared path per node, the second replica waits and reuses it.
  ``staging_uncoordinated_s``: the same 8 with a cache each (8 reads of the shared path,
  as 8 replicas reading ``model.path`` directly). Time until the last one is done.
- ``staging_tree_s`` (``--tree``): the coordinated staging over the nodes
  (:mod:`dynamoctl.modelcache.tree`): the first node reads the shared path, every node
  that has the model serves one that has not (1, 2, 4 nodes hold it), then the 8
  replicas stage (each finds its node's copy). Each node's cache is a directory of its
  own mounted at one path (a mount namespace per node), as a node-local disk is.
- ``spare_promotion_s``, ``spare_replacement_s``: copied from
  benchmarks/results/fast_start_spares.json (benchmarks/spares.py) when present, else null.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine

from dynamoctl.modelcache.tree import command_runner, stage_tree
from dynamoctl.settings.model_cache import ModelCacheSettings
from tests.infra.model_dir import model_dir
from tests.infra.netns import Network, network
from tests.infra.shared_fs import shared_fs

RESULTS = Path(__file__).parent / "results"
NODES = ["node-a", "node-b", "node-c", "node-d"]
REPLICAS_PER_NODE = 2

LOADER = """
import json, struct, sys, time
from pathlib import Path
began = time.monotonic()
total = 0
for shard in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(shard, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            start, end = t["data_offsets"]
            fh.seek(8 + n + start)
            total += fh.readinto(bytearray(end - start))
print(json.dumps({"seconds": time.monotonic() - began, "bytes": total}))
"""


def load_s(net: Network, node: str, path: Path) -> float:
    """Seconds one replica on ``node`` takes to read every tensor under ``path``."""
    out = subprocess.run(
        net.host(node).argv([sys.executable, "-c", LOADER, str(path)]),
        capture_output=True,
        check=True,
        timeout=900,
    )
    return float(json.loads(out.stdout)["seconds"])


def stage_all(net: Network, source: Path, caches: list[tuple[str, Path]]) -> float:
    """Seconds until every ``(node, cache dir)`` staging started at once has finished."""
    began = time.monotonic()
    procs = []
    for node, cache in caches:
        argv = [sys.executable, "-m", "dynamoctl.modelcache", str(source)]
        argv += ["--model-cache-dir", str(cache)]
        procs.append(subprocess.Popen(net.host(node).argv(argv), stdout=subprocess.PIPE))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    elapsed = time.monotonic() - began
    if any(p.returncode for p in procs):
        raise RuntimeError("a staging failed")
    copies = sum(1 for out in outs if not json.loads(out)["hit"])
    print(f"  {len(caches)} stagings, {copies} copies: {elapsed:.1f} s", flush=True)
    return elapsed


BIND = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def tree_s(net: Network, source: Path, rdir: Path) -> float:
    """Seconds until the tree has staged every node and the 8 replicas found their copy."""
    local = rdir / "node-local"  # the path every node sees its own cache directory at
    local.mkdir(parents=True)

    def on(node: str) -> list[str]:
        own = rdir / "tree" / node
        own.mkdir(parents=True, exist_ok=True)
        private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", BIND, "sh"]
        return net.host(node).argv([*private, str(own), str(local)])

    began = time.monotonic()
    settings = ModelCacheSettings(dir=str(local / "cache"))
    tree = asyncio.run(
        stage_tree(command_runner(on), NODES, net.addresses, str(source), settings, sys.executable)
    )
    replicas = [on(node) for node in NODES for _ in range(REPLICAS_PER_NODE)]
    argv = [sys.executable, "-m", "dynamoctl.modelcache", str(source)]
    argv += ["--model-cache-dir", str(local / "cache")]
    procs = [subprocess.Popen([*prefix, *argv], stdout=subprocess.PIPE) for prefix in replicas]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    elapsed = time.monotonic() - began
    if any(p.returncode for p in procs) or not all(json.loads(o)["hit"] for o in outs):
        raise RuntimeError("a replica's staging failed or found no copy")
    froms = [tree.staged[n]["from"].split(" ")[0] for n in NODES]
    print(f"  tree {tree.seconds:.1f} s ({', '.join(froms)}), then 8 hits: {elapsed:.1f} s")
    return elapsed


def spares() -> dict[str, Any]:
    path = RESULTS / "fast_start_spares.json"
    if not path.exists():
        return {"spare_promotion_s": None, "spare_replacement_s": None, "spares_source": None}
    data = json.loads(path.read_text())
    return {
        "spare_promotion_s": data.get("spare_promotion_s"),
        "spare_replacement_s": data.get("spare_replacement_s"),
        "spares_source": str(path.relative_to(RESULTS.parent.parent)),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    export = work / "export"
    model_dir(export / "model", args.model_mib << 20)
    arms = ("shared", "cache", "coord", "uncoord") + (("tree",) if args.tree else ())
    runs: dict[str, list[float]] = {k: [] for k in arms}
    with (
        network(["fileserver", *NODES]) as net,
        shared_fs(net.host("fileserver"), export, work / "shared", args.rate_mbit) as fs,
    ):
        source = fs.mount / "model"
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            rdir = work / f"round-{r}"
            coord = [(n, rdir / "coord" / n) for n in NODES for _ in range(REPLICAS_PER_NODE)]
            uncoord = [
                (n, rdir / "uncoord" / f"{n}-{i}") for n in NODES for i in range(REPLICAS_PER_NODE)
            ]
            stagings = [("tree", None)] if args.tree else []
            stagings += [("coord", coord), ("uncoord", uncoord)]
            for name, caches in stagings if r % 2 == 0 else stagings[::-1]:
                if caches is None:
                    runs[name].append(tree_s(net, source, rdir))
                else:
                    runs[name].append(stage_all(net, source, caches))
            cached = next((rdir / "coord" / "node-a").glob("*/model"))
            loads = [("shared", source), ("cache", cached)]
            for name, path in loads if r % 2 == 0 else loads[::-1]:
                runs[name].append(load_s(net, "node-a", path))
                print(f"  load from {name}: {runs[name][-1]:.2f} s", flush=True)
            shutil.rmtree(rdir)
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    return {
        "from_shared_s": med["shared"],
        "from_cache_s": med["cache"],
        "staging_coordinated_s": med["coord"],
        "staging_uncoordinated_s": med["uncoord"],
        **({"staging_tree_s": med["tree"]} if args.tree else {}),
        **spares(),
        "ratios": {
            "shared_over_cache": round(med["shared"] / med["cache"], 2),
            "uncoordinated_over_coordinated": round(med["uncoord"] / med["coord"], 2),
            **(
                {"uncoordinated_over_tree": round(med["uncoord"] / med["tree"], 2)}
                if args.tree
                else {}
            ),
        },
        "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "setup": {
            "model_bytes": sum(p.stat().st_size for p in (export / "model").iterdir()),
            "rate_mbit": args.rate_mbit,
            "nodes": len(NODES),
            "replicas": len(NODES) * REPLICAS_PER_NODE,
            "rounds": args.rounds,
            "shared_fs": "sftp-server in a namespace host, sshfs -o direct_io, tc tbf",
        },
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-mib", type=int, default=2048)
    parser.add_argument("--rate-mbit", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="store_true", help="add the tree arm (staging_tree_s)")
    parser.add_argument("--out", type=Path, default=RESULTS / "fast_start.json")
    parser.add_argument(
        "--refresh-spares",
        action="store_true",
        help="only copy the spare figures of fast_start_spares.json into --out (no staging run)",
    )
    args = parser.parse_args()
    if args.refresh_spares:
        kept = json.loads(args.out.read_text())
        args.out.write_text(json.dumps({**kept, **spares()}, indent=2) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="fast-start-") as tmp:
        result = run(args, Path(tmp))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
