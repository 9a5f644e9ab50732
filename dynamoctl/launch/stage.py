"""``python -m dynamoctl.launch.stage RECIPE``: stage the recipe's model (``model.path``)
into ``model.cache`` on every host of its SSH target, coordinated: one read of the shared
path in all, then each host that has it serves one that has not
(:mod:`dynamoctl.launch.ssh_tree`). Prints each host's result as JSON; exits 1 naming the
host that failed. The workers of ``up`` then find the model in their node's cache.
``model.cache.stage_ahead: true`` makes ``up`` itself do this before the engines start
(on Slurm with ``sbcast``; docs/operations.md, "Model cache").
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import msgspec

from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.ssh import SshLauncher
from dynamoctl.launch.ssh_tree import stage_hosts as stage_over_ssh
from dynamoctl.modelcache.cache import StagingError
from dynamoctl.modelcache.tree import TreeResult
from dynamoctl.recipe.loader import RecipeError, load_recipe
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SshTarget
from dynamoctl.settings.model_cache import ModelCacheSettings


async def stage_hosts(recipe: Recipe) -> TreeResult:
    """Every host of ``recipe``'s SSH target staged with ``model.cache``."""
    target, cache = recipe.target, recipe.model.cache
    if not isinstance(target, SshTarget) or cache is None:
        raise ValueError("needs an ssh target and model.cache")
    launcher = SshLauncher.from_target(target)
    addresses = {h: target.addresses.get(h) or socket.gethostbyname(h) for h in target.hosts}
    settings = ModelCacheSettings(**cache.model_dump(include=set(ModelCacheSettings.model_fields)))
    try:
        return await stage_over_ssh(
            launcher.command, target.hosts, addresses, recipe.model.path, settings, target.python
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
