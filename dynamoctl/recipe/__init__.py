"""Recipes: the versioned YAML description of a deployment (schema in :mod:`.models`)."""

from dynamoctl.recipe.loader import Issue, RecipeError, load_recipe, load_recipe_text
from dynamoctl.recipe.models import SCHEMA_VERSION, Recipe

__all__ = ["SCHEMA_VERSION", "Issue", "Recipe", "RecipeError", "load_recipe", "load_recipe_text"]
