"""The recipe's ``model.cache`` section: the node-local model cache (its fields are
``dynamoctl worker``'s, declared once in :mod:`dynamoctl.settings.model_cache`)."""

from __future__ import annotations

from pydantic import model_validator

from dynamoctl.recipe.fields import RecipeModel, rule_error
from dynamoctl.settings.model_cache import ModelCacheSettings


class ModelCache(RecipeModel, ModelCacheSettings):
    """Stage the weights into a directory on each node before its engines start
    (docs/operations.md, "Model cache")."""

    @model_validator(mode="after")
    def _absolute_dir(self) -> ModelCache:
        if self.dir is None:
            raise rule_error("dir", "is required (a node-local directory, e.g. /local/models)")
        if not self.dir.startswith("/"):
            raise rule_error("dir", f"{self.dir!r} must be absolute (the same on every node)")
        return self
