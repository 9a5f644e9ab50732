"""Extra capacity as the supervisor asks for it (``launch/capacity.py``): a launcher that
cannot grow refuses in the words ``scale`` answers, and the Slurm launcher's extra jobs
refuse what growth cannot hold before asking Slurm for anything (no Slurm client runs in
these tests; the extra jobs themselves are tests/slurm/test_growth_multinode.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import pytest

from dynamoctl.launch.capacity import (
    CapacityError,
    CapacityUser,
    GrowsCapacity,
    NoExtraCapacity,
    extra_capacity,
)
from dynamoctl.launch.slurm.growth import ExtraJobs
from dynamoctl.launch.slurm.launcher import SlurmLauncher
from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.recipe.models import Recipe
from dynamoctl.settings import Role


class Deployment:
    """The supervisor's side of the port, recording what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def place(self, role: Role, index: int) -> str:
        self.asked.append(f"place {role}-{index}")
        return f"{role}-{index}"

    def add_nodes(self, nodes: Sequence[str], addresses: Mapping[str, str]) -> None:
        self.asked.append(f"add {list(nodes)}")

    def remove_nodes(self, nodes: Sequence[str]) -> None:
        self.asked.append(f"remove {list(nodes)}")

    def occupied(self) -> set[str]:
        return set()

    async def stop_on(self, nodes: Collection[str], why: str) -> None:
        self.asked.append(f"stop on {sorted(nodes)}")

    def changed(self) -> None:
        pass

    def save(self) -> None:
        pass


def _recipe(target: str, pool: str = "gpus_per_replica: 8") -> Recipe:
    text = f"""\
schema: 1
name: g
discovery: {{backend: etcd, managed: true}}
target: {target}
model: {{name: m, path: /m}}
workers:
  agg: {{engine: vllm, {pool}}}
"""
    return load_recipe_text(text, "r.yaml")


SLURM = "{kind: slurm, partition: gpu, nodes: 2, gpus_per_node: 8, growth: GROWTH}"


def _slurm(growth: str, pool: str = "gpus_per_replica: 8") -> Recipe:
    return _recipe(SLURM.replace("GROWTH", growth), pool)


def _launcher() -> SlurmLauncher:
    return SlurmLauncher(job_id="41", env={"PATH": "/nonexistent"})


def _user() -> CapacityUser:
    return Deployment()


async def test_a_launcher_that_cannot_grow_refuses_in_the_words_scale_answers(
    tmp_path: Path,
) -> None:
    recipe = _recipe("{kind: local}")
    capacity = extra_capacity(object(), recipe, _user(), tmp_path)
    assert isinstance(capacity, NoExtraCapacity)
    with pytest.raises(CapacityError) as refused:
        await capacity.defer("agg", 2, "the GPU map is full")
    assert str(refused.value) == "no free GPUs left for another agg replica: the GPU map is full"
    assert capacity.waiting("agg") == [] and capacity.withdraw("agg", 1) == []
    assert capacity.status() == []


async def test_slurm_growth_off_refuses_without_asking_slurm(tmp_path: Path) -> None:
    launcher = _launcher()
    assert isinstance(launcher, GrowsCapacity)
    user = Deployment()
    capacity = extra_capacity(launcher, _slurm("{max_jobs: 0}"), user, tmp_path)
    assert isinstance(capacity, ExtraJobs)
    with pytest.raises(CapacityError, match=r"^no free GPUs left for another agg replica: full$"):
        await capacity.defer("agg", 2, "full")
    assert capacity.status() == [] and user.asked == [] and launcher.extra_jobs == {}


async def test_an_extra_job_too_small_for_a_replica_is_never_submitted(tmp_path: Path) -> None:
    # A gang of two nodes does not fit an extra job of one: said, naming the field.
    recipe = _slurm("{max_jobs: 1, nodes_per_job: 1}", "nodes_per_replica: 2, gpus_per_replica: 16")
    user = Deployment()
    capacity = extra_capacity(_launcher(), recipe, user, tmp_path)
    with pytest.raises(CapacityError) as refused:
        await capacity.defer("agg", 1, "full")
    assert "target.growth.nodes_per_job=1 node(s) cannot hold one" in str(refused.value)
    assert capacity.status() == [] and user.asked == []


def test_a_slurm_launcher_grows_only_a_slurm_recipe(tmp_path: Path) -> None:
    capacity = extra_capacity(_launcher(), _recipe("{kind: local}"), _user(), tmp_path)
    assert isinstance(capacity, NoExtraCapacity)
