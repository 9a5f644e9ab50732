"""GPUs a host really has, checked against what the plan gives its instances."""

from __future__ import annotations

import shutil
import subprocess

from dynamoctl.launch.api import InstanceSpec, LaunchError

FIX_GPU_COUNT = "correct it, or lower the pools' gpus_per_replica or replicas"


def count_local_gpus() -> int:
    """GPUs ``nvidia-smi -L`` lists on this machine; 0 when it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def check_gpus(host: str, have: int, instances: list[InstanceSpec], source: str, fix: str) -> None:
    """Refuse a plan that gives an instance on ``host`` a GPU index it does not have;
    ``source`` is the recipe field the plan counted on, ``fix`` what to do."""
    for spec in instances:
        here = spec.host == host or host in spec.mpi_nodes  # an MPI world's every node
        if here and spec.gang and spec.gpus and have != len(spec.gpus):
            # A gang's ranks are laid out evenly (vLLM's local world size, SGLang's GPUs
            # per node): a node with another count breaks the engine's arithmetic.
            raise LaunchError(
                f"{spec.name} (gang {spec.gang}, rank {spec.rank}): {host} has {have} GPU(s) "
                f"but every node of a multi-node replica must have {len(spec.gpus)} (from "
                f"{source}); mixed GPU counts per node cannot hold one gang"
            )
        if here and spec.gpus and max(spec.gpus) >= have:
            raise LaunchError(
                f"{spec.name}: {host} has {have} GPU(s) for this deployment but the plan "
                f"gives it GPU(s) {','.join(map(str, spec.gpus))} (from {source}); {fix}"
            )
