"""``python -m dynamoctl.launch.stage RECIPE``: stage the recipe's model (``model.path``)
into ``model.cache`` on every host of its SSH target before ``up``, coordinated: one read
of the shared path in all, then each host that has it serves one that has not
(:mod:`dynamoctl.modelcache.tree`). Prints each host's result as JSON; exits 1 naming the
host that failed. The workers of ``up`` then find the model in their node's cache.

A Slurm allocation stages with one ``srun`` step per node instead (docs/operations.md,
"Model cache"): its nodes read the shared path once each.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.ssh import Process, SshLauncher
from dynamoctl.modelcache.cache import StagingError
from dynamoctl.modelcache.tree import NodeProcess, TreeResult, stage_tree
from dynamoctl.recipe.loader import RecipeError, load_recipe
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SshTarget
from dynamoctl.settings.model_cache import ModelCacheSettings


@dataclass
class _SshStep:
    proc: Process

    async def readline(self) -> bytes:
        return await self.proc.stdout.readline()

    def close_input(self) -> None:
        self.proc.stdin.write_eof()

    async def wait(self) -> int:
        done = await self.proc.wait()
        return done.returncode if done.returncode is not None else -1


async def stage_hosts(recipe: Recipe) -> TreeResult:
    """Every host of ``recipe``'s SSH target staged with ``model.cache``."""
    target, cache = recipe.target, recipe.model.cache
    if not isinstance(target, SshTarget) or cache is None:
        raise ValueError("needs an ssh target and model.cache")
    launcher = SshLauncher.from_target(target)
    addresses = {h: target.addresses.get(h) or socket.gethostbyname(h) for h in target.hosts}
    settings = ModelCacheSettings(**cache.model_dump(include=set(ModelCacheSettings.model_fields)))

    async def run(host: str, argv: list[str]) -> NodeProcess:
        return _SshStep(await launcher.command(host, argv))

    try:
        return await stage_tree(
            run, target.hosts, addresses, recipe.model.path, settings, python=target.python
        )
    finally:
        await launcher.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dynamoctl.launch.stage RECIPE", file=sys.stderr)
        return 2
    try:
        recipe = load_recipe(Path(args[0]))
        result = asyncio.run(stage_hosts(recipe))
    except (RecipeError, ValueError, StagingError, LaunchError) as exc:
        print(f"dynamoctl stage: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(msgspec.to_builtins(result.__dict__)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
