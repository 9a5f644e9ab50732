"""Extra Slurm jobs of a deployment grown beyond its allocation: submit one shaped as the
allocation, learn its nodes, cancel it (recipe ``target.growth``; the policy is the
supervisor's, ``supervisor/growth.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dynamoctl.launch.slurm.jobs import submit
from dynamoctl.recipe.targets import SlurmTarget

HOLDER_SCRIPT = Path(__file__).with_name("growth.sh")
"""The extra job's batch script: holds its nodes while the deployment's job runs."""


async def submit_extra_job(
    target: SlurmTarget,
    parent_job: str,
    *,
    name: str,
    output: Path,
    drain_timeout: float,
    env: Mapping[str, str],
) -> str:
    """Submit one extra job of ``target.growth.nodes_per_job`` nodes, otherwise shaped as
    the allocation (partition, account, GPUs, time limit, extra arguments); its job id."""
    shape = target.model_copy(update={"nodes": target.growth.nodes_per_job})
    return await submit(
        shape,
        HOLDER_SCRIPT,
        [parent_job],
        job_name=f"dynamoctl-{name}-growth",
        output=output,
        drain_timeout=drain_timeout,
        env=env,
    )
