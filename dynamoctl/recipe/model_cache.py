"""The recipe's ``model.cache`` section: the node-local model cache (its fields are
``dynamoctl worker``'s, declared once in :mod:`dynamoctl.settings.model_cache`)."""

from __future__ import annotations

from pydantic import model_validator

from dynamoctl.recipe.fields import RecipeModel, rule_error
from dynamoctl.settings.model_cache import ModelCacheSettings


class ModelCache(RecipeModel, ModelCacheSettings):
    """Stage the weights into a directory on each node before its engines start
    (docs/operations.md, "Model cache")."""

    stage_ahead: bool = False
    """Stage the model onto every node once, coordinated, before any engine starts: on
    Slurm, the first node copies it from ``model.path`` and ``sbcast`` (Slurm's own tree)
    sends that copy to every other node of the allocation, each checking it against the
    first node's checksums; over SSH, each host that has it serves one that has not
    (one read of the shared path in all). Nodes that hold it already copy nothing. Off:
    each node's first start copies from the shared path by itself."""

    @model_validator(mode="after")
    def _absolute_dir(self) -> ModelCache:
        if self.dir is None:
            raise rule_error("dir", "is required (a node-local directory, e.g. /local/models)")
        if not self.dir.startswith("/"):
            raise rule_error("dir", f"{self.dir!r} must be absolute (the same on every node)")
        return self
