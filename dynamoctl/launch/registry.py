"""Launchers by target kind, imported lazily (asyncssh only for ``ssh``, ...)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dynamoctl.launch.api import Launcher
from dynamoctl.recipe.models import Recipe
from dynamoctl.util.registry import Registry

LAUNCHERS: Registry[str] = Registry("target kind")
"""Target kind -> ``"module:factory"``; a factory takes the recipe and returns a Launcher."""
LAUNCHERS.add("local", "dynamoctl.launch.local:from_recipe")
LAUNCHERS.add("ssh", "dynamoctl.launch.ssh:from_recipe")
LAUNCHERS.add("slurm", "dynamoctl.launch.slurm.launcher:from_recipe")


def launcher_for(recipe: Recipe) -> Launcher:
    module, _, factory = LAUNCHERS[recipe.target.kind].partition(":")
    make: Callable[[Recipe], Launcher] = getattr(importlib.import_module(module), factory)
    return make(recipe)
