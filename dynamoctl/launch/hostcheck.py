"""What a launcher checks on a host before anything starts, run on that host.

    python -m dynamoctl.launch.hostcheck WORKDIR PORTS [PATHS]

``PORTS`` is JSON: a list of TCP ports, or (one Slurm step on every node) a mapping from
node name to its list, looked up under ``$SLURMD_NODENAME``; ``PATHS`` the same for
directories instances will write (a KV offload disk tier). Prints one line,
``dynamoctl-hostcheck {"host": ..., "workdir": error or null, "busy": {port: why},
"paths": {path: why}, "gpus": N}``. That the interpreter got this far proves it has
dynamoctl installed. GPUs are those ``nvidia-smi`` lists, or in a Slurm step those the job
holds on the node.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from dynamoctl.launch.gpus import count_local_gpus

MARK = "dynamoctl-hostcheck"


def busy_ports(ports: list[int]) -> dict[str, str]:
    """Ports something already listens on, on any address here, with the reason."""
    busy = {}
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError as exc:
                busy[str(port)] = exc.strerror or str(exc)
    return busy


def unusable_paths(paths: list[str]) -> dict[str, str]:
    """Directories that are missing or not writable here, with the reason."""
    bad = {}
    for path in paths:
        if not os.path.isdir(path):
            bad[path] = "does not exist" if not os.path.exists(path) else "is not a directory"
        elif not os.access(path, os.W_OK | os.X_OK):
            bad[path] = "is not writable"
    return bad


def check(workdir: str, spec: Any, path_spec: Any = ()) -> dict[str, Any]:
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    ports = spec.get(host, []) if isinstance(spec, dict) else spec
    paths = path_spec.get(host, []) if isinstance(path_spec, dict) else path_spec
    result: dict[str, Any] = {"host": host, "workdir": None}
    # Before the chdir: a relative path means the same as on the supervisor's side.
    result["paths"] = unusable_paths([str(p) for p in paths])
    try:
        os.chdir(workdir or ".")
    except OSError as exc:
        result["workdir"] = exc.strerror
    result["busy"] = busy_ports([int(p) for p in ports])
    # Inside a Slurm step: the GPUs the job holds on this node (a step that asks for no
    # GRES gets all of them), which is what the instances can use.
    on_node = os.environ.get("SLURM_GPUS_ON_NODE")
    result["gpus"] = int(on_node) if on_node is not None else count_local_gpus()
    return result


def parse(output: str) -> list[dict[str, Any]]:
    """The results in a command's output (one per host that ran it)."""
    prefix = MARK + " "
    return [
        json.loads(line[len(prefix) :]) for line in output.splitlines() if line.startswith(prefix)
    ]


if __name__ == "__main__":
    paths = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
    print(MARK, json.dumps(check(sys.argv[1], json.loads(sys.argv[2]), paths)), flush=True)
